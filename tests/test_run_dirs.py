"""Run directories (fedapp.run_log, fedapp.model_file): never reused, a truncated last line of
``rounds.jsonl`` skipped with a warning that names the file and line, ``final_model.pt``
written atomically and read back with ``weights_only``."""

from __future__ import annotations

import json

import pytest
import torch

from fedapp.model_file import read_model, write_model
from fedapp.run_log import RunLog, new_run_directory, read_rounds
from simulation.reliability import run_inprocess
from tests.reliability_common import config

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_a_run_directory_that_exists_gets_a_new_name(tmp_path):
    first = new_run_directory(tmp_path, "20250101-000000-fedavg-run7")
    (first / "rounds.jsonl").write_text('{"round": 0}\n')
    second = new_run_directory(tmp_path, "20250101-000000-fedavg-run7")
    third = new_run_directory(tmp_path, "20250101-000000-fedavg-run7")
    assert [second.name, third.name] == ["20250101-000000-fedavg-run7-2",
                                         "20250101-000000-fedavg-run7-3"]
    assert (first / "rounds.jsonl").read_text() == '{"round": 0}\n'


def test_run_logs_of_the_same_second_and_run_id_do_not_share_a_directory(tmp_path):
    logs = [RunLog.create(tmp_path, "fedavg", 7, {"run-config": {}}) for _ in range(3)]
    logs[0].append_round({"round": 0})
    assert len({log.directory for log in logs}) == 3
    assert read_rounds(logs[0].directory) == [{"round": 0}]


@pytest.mark.usefixtures("processes")
def test_in_process_runs_with_a_fixed_run_id_keep_each_others_run_logs(tmp_path):
    rc = config("fedavg", tmp_path / "out", **{"num-server-rounds": 1})
    _, first = run_inprocess(rc, 2)  # run id 7 both times
    logged = (first / "rounds.jsonl").read_text()
    _, second = run_inprocess(rc, 2)
    assert first != second and (first / "rounds.jsonl").read_text() == logged
    assert len(read_rounds(first)) == len(read_rounds(second)) == 2


def write_log(run_dir, text: str):
    run_dir.mkdir(exist_ok=True)
    (run_dir / "rounds.jsonl").write_text(text)
    return run_dir


@pytest.mark.parametrize("tail", ['{"round": 2, "accur', '{"round"', "[1, 2]", "\x00\x00"])
def test_a_truncated_last_line_is_skipped_with_a_warning_naming_file_and_line(tmp_path, tail):
    run_dir = write_log(tmp_path / "run", '{"round": 0}\n\n{"round": 1}\n' + tail)
    with pytest.warns(RuntimeWarning, match=rf"{run_dir / 'rounds.jsonl'}, line 4: skipped"):
        assert read_rounds(run_dir) == [{"round": 0}, {"round": 1}]


def test_a_bad_line_before_the_last_is_an_error_naming_file_and_line(tmp_path):
    run_dir = write_log(tmp_path / "run", '{"round": 0}\n{"rou\n{"round": 2}\n')
    with pytest.raises(ValueError, match=r"rounds.jsonl, line 2: not JSON .* file was damaged"):
        read_rounds(run_dir)


def test_a_whole_last_line_without_its_newline_is_read(tmp_path):
    run_dir = write_log(tmp_path / "run", '{"round": 0}\n{"round": 1}')
    assert read_rounds(run_dir) == [{"round": 0}, {"round": 1}]
    assert read_rounds(write_log(tmp_path / "empty", "")) == []


def test_the_final_model_is_written_atomically_and_read_with_weights_only(tmp_path):
    state = {"w": torch.arange(4.0), "b": torch.zeros(2, dtype=torch.float64)}
    path = write_model(state, tmp_path / "final_model.pt")
    back = read_model(path)
    assert list(back) == ["w", "b"] and all(torch.equal(back[k], state[k]) for k in state)
    with pytest.raises(Exception):  # torch.save cannot pickle a lambda: the old file stays
        write_model({"w": lambda: 0}, path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final_model.pt"]
    assert torch.equal(read_model(path)["w"], state["w"])


def test_a_final_model_that_would_run_code_is_refused(tmp_path):
    """weights_only: a planted final_model.pt with a pickled callable is not run."""
    class Planted:
        def __reduce__(self):
            return (open, (str(tmp_path / "pwned"), "w"))

    torch.save({"w": Planted()}, tmp_path / "final_model.pt")
    with pytest.raises(Exception, match="Weights only load failed"):
        read_model(tmp_path / "final_model.pt")
    assert not (tmp_path / "pwned").exists()


def test_config_json_names_the_run_and_rounds_jsonl_starts_empty(tmp_path):
    log = RunLog.create(tmp_path, "fedavg", 3, {"run-config": {"seed": 1}})
    assert json.loads((log.directory / "config.json").read_text()) == {"run-config": {"seed": 1}}
    assert (log.directory / "rounds.jsonl").read_text() == ""
