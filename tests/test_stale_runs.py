"""A run that a stopped launch left pending in the managed SuperLink's state.db must not
start again beside the next launch's run (a stopped sweep once came back as two runs of
the same cell in parallel). Real ``flwr run`` twice on one FLWR_HOME, tiny config."""

from __future__ import annotations

import pytest

from simulation.runtime import local_superlink, local_superlink_pids, run_app
from simulation.runtime.local_superlink import local_superlink_dir, superlink_state

pytest.importorskip("flwr")

from flwr.common.constant import Status, SubStatus  # noqa: E402

# Flower's state classes run alembic, whose config Flower has not updated (not ours to fix)
pytestmark = pytest.mark.filterwarnings("ignore:No path_separator found:DeprecationWarning")

TINY = {"num-server-rounds": 1, "dataset": "synthetic", "model": "mlp-2nn", "local-steps": 1}
FEDERATION = {"num-supernodes": 2, "client-resources-num-cpus": 1}


def leave_a_pending_copy(flwr_home, run_id: int) -> int:
    """What a launch stopped right after ``flwr run`` created its run leaves behind: the same
    run created again through Flower's ``create_run`` (as its Control API does), never started."""
    state = superlink_state(flwr_home)
    run = state.get_run_info(run_ids=[run_id])[0]
    return state.create_run(run.fab_id, run.fab_version, run.fab_hash, run.override_config,
                            run.federation_id, state.get_federation_config(run_id),
                            run.flwr_aid, run.primary_task_type)


@pytest.mark.usefixtures("processes")
def test_a_run_left_pending_by_a_stopped_launch_is_marked_stopped_not_started(tmp_path, capfd):
    home, out = tmp_path / "flwr-home", tmp_path / "runs"
    config = {**TINY, "output-dir": str(out)}
    first = run_app(config, FEDERATION, flwr_home=home, timeout=300, isolate_ports=True,
                    capture=True)
    assert first.status == "finished:completed", first.output[-4000:]
    stale = leave_a_pending_copy(home, first.run_id)
    pending = superlink_state(home).get_tasks(statuses=[Status.PENDING])
    assert [t.run_id for t in pending] == [stale]

    second = run_app(config, FEDERATION, flwr_home=home, timeout=300, isolate_ports=True,
                     capture=True)
    assert second.status == "finished:completed", second.output[-4000:]
    state = superlink_state(home)
    status = state.get_run_status({stale})[stale]
    assert (status.status, status.sub_status) == (Status.FINISHED, SubStatus.STOPPED)
    assert not state.get_run_info(run_ids=[stale])[0].starting_at  # it never started
    assert len(list(out.iterdir())) == 2  # the two launches' runs, no third
    assert f"run {stale} in {home.resolve()} was left unfinished" in capfd.readouterr().err
    assert local_superlink_pids(home) == []


def test_an_unreadable_state_file_is_named_and_the_run_goes_ahead(tmp_path, capfd, monkeypatch):
    home = tmp_path / "flwr-home"
    local_superlink_dir(home).mkdir(parents=True)
    (local_superlink_dir(home) / "state.db").write_bytes(b"not a database")
    submitted = []
    monkeypatch.setattr(local_superlink, "submit_run", lambda cmd, *a, **k: submitted.append(cmd))
    monkeypatch.setattr(local_superlink, "start_local_superlink", lambda *a, **k: None)
    run_app(TINY, FEDERATION, flwr_home=home, capture=True)
    assert submitted  # the run still goes to `flwr run`
    err = capfd.readouterr().err
    assert f"could not read {local_superlink_dir(home.resolve()) / 'state.db'}" in err
    assert "delete that file" in err
