"""A run's config is checked in the driver before `flwr run` starts, by the ServerApp's
own rules (simulation/preflight.py): a typo fails at once and a sweep checks every run
before its first."""

from __future__ import annotations

import argparse

import pytest

from simulation import __main__ as simulation_cli
from simulation import run as run_tool
from simulation import sweep


@pytest.fixture
def no_flwr_run(monkeypatch):
    """run_app replaced: a test fails if anything would start."""
    started = []
    monkeypatch.setattr(run_tool, "run_app", lambda *a, **k: started.append(a) or 1 / 0)
    monkeypatch.setattr(sweep, "run_app", lambda *a, **k: started.append(a) or 1 / 0)
    return started


def test_run_with_a_bad_value_stops_before_flwr_run(no_flwr_run):
    with pytest.raises(SystemExit) as info:
        simulation_cli.main(["run", "-c", "strategy=fedavgg"])
    message = str(info.value)
    assert message.startswith("run config: strategy='fedavgg' is not allowed "
                              "(did you mean 'fedavg'?)")
    assert "Set it with: -c strategy=fedavg\n" in message  # the user's syntax
    assert message.endswith("(checked before flwr run started; nothing ran)")
    assert no_flwr_run == []


@pytest.mark.parametrize("override, says", [
    ("dirichlet-alpha=0", "dirichlet-alpha=0.0 is not allowed"),
    ("num-server-rounds=0", "num-server-rounds=0 is not allowed"),
    ("learning-rate=0.1", "unknown key(s) learning-rate"),
    ("fedprox-mu=-1", "fedprox-mu"),  # a strategy's own check, though FedAvg runs
])
def test_the_servers_rules_apply_in_the_driver(no_flwr_run, override, says):
    with pytest.raises(SystemExit, match=says.replace("(", r"\(").replace(")", r"\)")):
        simulation_cli.main(["run", "-c", override])
    assert no_flwr_run == []


def test_a_sweep_with_one_bad_variant_starts_no_run(tmp_path, no_flwr_run):
    path = tmp_path / "sweep.toml"
    path.write_text('seeds = [0, 1]\n[variants.good]\nlr = 0.1\n'
                    '[variants.bad]\ndirichlet-alpha = 0.0\n')
    with pytest.raises(SystemExit) as info:
        simulation_cli.main(["sweep", str(path), "--out", str(tmp_path / "out")])
    assert str(info.value).startswith(
        "variant 'bad', seed 0: run config: dirichlet-alpha=0.0 is not allowed")
    assert no_flwr_run == []


def test_deploy_run_refuses_a_bad_run_config_as_a_usage_error(capsys):
    from deploy.run import add_arguments, run  # noqa: PLC0415

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert run(parser.parse_args(["-c", "partition=shard", "--workdir", "/nonexistent"])) == 2
    err = capsys.readouterr().err
    assert "python -m deploy run: error: run config: partition='shard' is not allowed" in err
    assert "did you mean 'shards'?" in err and err.rstrip().endswith("Set it with: -c partition=shards")
    assert "--run-config" not in err  # the fix in deploy run's own syntax (#58)


def test_device_cuda_for_clientapps_without_a_gpu_share_stops_before_flwr_run(no_flwr_run,
                                                                              monkeypatch):
    """Ray hides the GPU from a ClientApp that asks for no share: each would fail."""
    from simulation.runtime import federation  # noqa: PLC0415

    with pytest.raises(SystemExit) as info:
        simulation_cli.main(["run", "-c", "device='cuda:0'"])
    assert str(info.value).startswith("run config check: device='cuda:0', but the ClientApps "
                                      "ask for no GPU share")
    assert "--gpus-per-client 0.25" in str(info.value) and no_flwr_run == []
    monkeypatch.setattr(federation, "visible_gpus", lambda: 1)
    with pytest.raises(ZeroDivisionError):  # checked, then handed to (the stand-in) flwr run
        simulation_cli.main(["run", "-c", "device='cuda'", "--gpus-per-client", "0.25"])
    assert len(no_flwr_run) == 1


def test_a_sweep_variant_on_cuda_needs_the_files_gpu_share(tmp_path, no_flwr_run):
    path = tmp_path / "sweep.toml"
    path.write_text('seeds = [0]\n[variants.cpu]\nlr = 0.1\n[variants.gpu]\ndevice = "cuda"\n')
    with pytest.raises(SystemExit) as info:
        simulation_cli.main(["sweep", str(path), "--out", str(tmp_path / "out")])
    assert str(info.value).startswith("variant 'gpu', seed 0: device='cuda', but the "
                                      "ClientApps ask for no GPU share")
    assert "a sweep file's gpus-per-client = 0.25" in str(info.value) and no_flwr_run == []


def test_a_federation_smaller_than_min_available_nodes_stops_before_flwr_run(no_flwr_run):
    """The default min-available-nodes = 2 on one SuperNode would wait forever."""
    with pytest.raises(SystemExit) as info:
        simulation_cli.main(["run", "--num-supernodes", "1"])
    message = str(info.value)
    assert "min-available-nodes=2, but the federation has 1 SuperNode(s)" in message
    assert "-c min-available-nodes=1, or --num-supernodes 2" in message
    assert no_flwr_run == []


def test_deploy_run_refuses_more_min_available_nodes_than_supernodes(tmp_path):
    from deploy.run import add_arguments, spec_of

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(ValueError, match="min-available-nodes=3, but --num-supernodes is 2"):
        spec_of(parser.parse_args(["--num-supernodes", "2", "--workdir", str(tmp_path),
                                   "-c", "min-available-nodes=3"]))
    spec, overrides = spec_of(parser.parse_args(["--num-supernodes", "2",
                                                 "--workdir", str(tmp_path)]))
    assert overrides["min-available-nodes"] == 2


def test_packed_runs_wait_for_their_virtual_clients_not_the_supernodes(no_flwr_run, tmp_path):
    """virtual-clients = 10 on 2 SuperNodes: min-available-nodes may be 10, not more."""
    from deploy.run import add_arguments, spec_of

    with pytest.raises(SystemExit) as info:
        simulation_cli.main(["run", "--num-supernodes", "2", "-c", "virtual-clients=10",
                             "-c", "min-available-nodes=11"])
    assert ("min-available-nodes=11, but there are virtual-clients=10: the ServerApp would "
            "wait for nodes forever. Give -c min-available-nodes=10") in str(info.value)
    with pytest.raises(SystemExit) as info:
        simulation_cli.main(["run", "--num-supernodes", "2", "-c", "min-available-nodes=10"])
    assert "or serve them packed (-c virtual-clients=10)" in str(info.value)
    assert no_flwr_run == []
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    _, overrides = spec_of(parser.parse_args(["--num-supernodes", "2", "--workdir",
                                              str(tmp_path), "-c", "virtual-clients=10"]))
    assert overrides["min-available-nodes"] == 10
    with pytest.raises(ValueError, match="min-available-nodes=11, but there are virtual-cli"):
        spec_of(parser.parse_args(["--num-supernodes", "2", "--workdir", str(tmp_path),
                                   "-c", "virtual-clients=10", "-c", "min-available-nodes=11"]))
