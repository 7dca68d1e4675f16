"""Bad command-line input is a usage error before anything starts: the simulation
federation's options typed as Flower 1.41 takes them (simulation/runtime/federation.py),
counts and fractions (simulation/runtime/option_types.py)."""

from __future__ import annotations

import argparse

import pytest

from simulation import __main__ as simulation_cli
from simulation import sweep
from simulation.runtime import FederationConfigError, federation_value, flwr_run_command


@pytest.mark.parametrize("key, value, typed", [
    ("client-resources-num-cpus", 2.0, 2),
    ("client-resources-num-cpus", "3", 3),
    ("client-resources-num-cpus", 1, 1),
    ("num-supernodes", 10.0, 10),
    ("init-args-num-cpus", "4", 4),
    ("init-args-num-gpus", 0, 0),
    ("client-resources-num-gpus", 0.25, 0.25),
    ("client-resources-num-gpus", "2", 2.0),
    ("backend", "ray", "ray"),  # a key this module does not type passes through
])
def test_values_flower_takes_are_typed_as_it_takes_them(key, value, typed):
    result = federation_value(key, value)
    assert result == typed and type(result) is type(typed)


@pytest.mark.parametrize("key, value, says", [
    ("client-resources-num-cpus", 0.5, "init-args-num-cpus"),
    ("client-resources-num-cpus", 0, "whole number >= 1"),
    ("num-supernodes", 0, "whole number >= 1"),
    ("num-supernodes", 2.5, "whole number >= 1"),
    ("init-args-num-gpus", -1, "whole number >= 0"),
    ("client-resources-num-gpus", -0.5, "between 0 and 1"),
    ("client-resources-num-gpus", 1.5, "whole number of GPUs"),
    ("client-resources-num-cpus", True, "not true / false"),
    ("client-resources-num-cpus", "two", "give a number"),
    ("client-resources-num-gpus", float("nan"), "finite"),
])
def test_a_value_flower_would_refuse_names_the_key_the_value_and_the_fix(key, value, says):
    with pytest.raises(FederationConfigError) as info:
        federation_value(key, value)
    assert str(info.value).startswith(f"{key}={value!r}: ")
    assert says in str(info.value)
    assert (info.value.key, info.value.value) == (key, value)


def test_flwr_run_gets_whole_cpus_even_from_a_float():
    cmd = flwr_run_command(None, {"num-supernodes": 2, "client-resources-num-cpus": 2.0})
    assert cmd[cmd.index("--federation-config") + 1] == (
        "num-supernodes=2 client-resources-num-cpus=2")
    with pytest.raises(FederationConfigError, match="client-resources-num-cpus=0.5"):
        flwr_run_command(None, {"client-resources-num-cpus": 0.5})


def test_run_takes_whole_cpus_per_client():
    args = simulation_cli.build_parser("run").parse_args(
        ["run", "--cpus-per-client", "2", "--gpus-per-client", "0.25", "--num-supernodes", "4"])
    assert (args.cpus_per_client, args.gpus_per_client, args.num_supernodes) == (2, 0.25, 4)
    assert type(args.cpus_per_client) is int


@pytest.mark.parametrize("command, option, value, says", [
    (["run"], "--cpus-per-client", "0.5", "init-args-num-cpus"),
    (["run"], "--num-supernodes", "0", "whole number >= 1"),
    (["run"], "--gpus-per-client", "-1", "between 0 and 1"),
    (["bench", "efficiency"], "--gpus-per-client", "1.5", "whole number of GPUs"),
    (["bench", "scale"], "--cpus-per-client", "1.5", "whole number >= 1"),
])
def test_a_bad_option_is_a_usage_error_naming_it_and_flowers_key(capsys, command, option,
                                                                 value, says):
    with pytest.raises(SystemExit) as info:
        simulation_cli.main([*command, option, value])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: {value!r} (Flower's federation option " in err
    assert says in err


def test_a_sweep_file_with_fractional_cpus_per_client_fails_before_any_run(tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_text('seeds = [0]\ncpus-per-client = 0.5\n[variants.a]\nlr = 0.1\n')
    with pytest.raises(ValueError) as info:
        sweep.load_sweep(path)
    message = str(info.value)
    assert message.startswith(f"{path}: cpus-per-client = 0.5 (Flower's federation option "
                              "client-resources-num-cpus): give a whole number >= 1")
    with pytest.raises(SystemExit) as exit_info:
        simulation_cli.main(["sweep", str(path), "--out", str(tmp_path / "out")])
    assert str(exit_info.value) == f"sweep: {message}"
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_sweep_files_federation_is_typed(tmp_path):
    path = tmp_path / "ok.toml"
    path.write_text('seeds = [0]\nnum-supernodes = 4\ncpus-per-client = 2.0\n[variants.a]\n')
    assert sweep.federation(sweep.load_sweep(path)) == {
        "num-supernodes": 4, "client-resources-num-cpus": 2}
    assert sweep.federation({"seeds": [0], "variants": {}}) == {
        "num-supernodes": 10, "client-resources-num-cpus": 1}  # no GPU share: Flower's default
    path.write_text('seeds = [0]\ngpus-per-client = 0.25\n[variants.a]\n')
    assert sweep.federation(sweep.load_sweep(path))["client-resources-num-gpus"] == 0.25
    path.write_text('seeds = [0]\ngpus-per-client = -1\n[variants.a]\n')
    with pytest.raises(ValueError, match="gpus-per-client = -1 .*between 0 and 1"):
        sweep.load_sweep(path)


def test_a_sweep_asking_a_gpu_share_where_torch_sees_none_stops_before_any_run(tmp_path,
                                                                             monkeypatch):
    from simulation.runtime import federation  # noqa: PLC0415

    monkeypatch.setattr(federation, "visible_gpus", lambda: 0)
    path = tmp_path / "gpu.toml"
    path.write_text('seeds = [0]\ngpus-per-client = 0.5\n[variants.a]\nlr = 0.1\n')
    with pytest.raises(SystemExit) as info:
        simulation_cli.main(["sweep", str(path), "--out", str(tmp_path / "out")])
    assert str(info.value).startswith(f"sweep: {path}: client-resources-num-gpus=0.5: no "
                                      "ClientApp can start: 0 GPU(s) visible here")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command, option, value, minimum", [
    (["bench", "aggregation"], "--replies", "0", 1),
    (["bench", "aggregation"], "--repeats", "-2", 1),
    (["bench", "efficiency"], "--rounds", "1", 2),  # round 1 is not timed
    (["bench", "efficiency"], "--eval-every", "0", 1),
    (["bench", "overhead"], "--batch-size", "0", 1),
    (["bench", "deploy"], "--supernodes", "0", 1),
    (["bench", "sync-events"], "--local-steps", "x", 1),
    (["faults-table"], "--nodes", "0", 1),
    (["resume-check"], "--rounds", "0", 1),
])
def test_a_count_below_its_minimum_is_a_usage_error(capsys, command, option, value, minimum):
    with pytest.raises(SystemExit) as info:
        simulation_cli.main([*command, option, value])
    assert info.value.code == 2
    assert f"argument {option}: {value!r}: give a whole number >= {minimum}" in (
        capsys.readouterr().err)


def test_the_bench_clients_are_simulated_supernodes():
    with pytest.raises(SystemExit):
        simulation_cli.main(["bench", "efficiency", "--clients", "0"])
    args = simulation_cli.build_parser("bench").parse_args(
        ["bench", "scale", "--clients", "10", "100.0"])
    assert args.clients == [10, 100]


@pytest.mark.parametrize("value", ["80", "-0.1", "x"])
def test_a_report_target_outside_0_to_1_is_a_usage_error(capsys, value, tmp_path):
    with pytest.raises(SystemExit) as info:
        simulation_cli.main(["report", str(tmp_path), "--target", value])
    assert info.value.code == 2
    assert (f"argument --target: {value!r}: give a number from 0 to 1 (0.8 for 80 %)"
            in capsys.readouterr().err)


def test_resume_check_needs_a_round_after_the_kill():
    with pytest.raises(SystemExit) as info:
        simulation_cli.main(["resume-check", "--rounds", "3"])
    assert str(info.value) == ("resume-check: --rounds 3: the check kills each run after round 3 "
                               "and resumes it, so give --rounds >= 4")


@pytest.mark.parametrize("command", [["run"], ["sweep", "any.toml"]])
def test_a_ray_address_nobody_answers_at_is_a_usage_error(capsys, command):
    from simulation.runtime import free_port

    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(SystemExit) as info:
        simulation_cli.main([*command, "--ray-address", address])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --ray-address: {address!r}: no Ray head answers there" in err
    assert "ray start --head --port=6379" in err


@pytest.mark.parametrize("address", ["6379", "host:", ":6379", "host:port", "host:70000"])
def test_a_ray_address_must_be_host_and_port(address):
    from simulation.runtime.ray_cluster import ray_address

    with pytest.raises(argparse.ArgumentTypeError, match="give HOST:PORT of the Ray head"):
        ray_address(address)


def test_a_listening_ray_address_is_taken():
    import socket

    from simulation.runtime.ray_cluster import ray_address

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = f"127.0.0.1:{server.getsockname()[1]}"
        assert ray_address(address) == address


def test_clientapps_that_ask_for_more_cpus_than_ray_gets_are_refused(monkeypatch):
    from simulation.runtime import refuse_unfittable  # noqa: PLC0415

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    refuse_unfittable({"client-resources-num-cpus": 2})
    with pytest.raises(FederationConfigError, match=r"Ray gets 2 CPUs \(this machine's CPUs\); "
                                                    r"give at most 2"):
        refuse_unfittable({"client-resources-num-cpus": 4})
    # more CPUs for Ray than cores: Flower's way to run more ClientApps at once
    refuse_unfittable({"client-resources-num-cpus": 4, "init-args-num-cpus": 8})
    with pytest.raises(FederationConfigError, match=r"Ray gets 3 CPUs \(init-args-num-cpus\)"):
        refuse_unfittable({"client-resources-num-cpus": 4, "init-args-num-cpus": 3})
    # on a Ray cluster its resources count, not this machine's
    refuse_unfittable({"client-resources-num-cpus": 16}, ray_address="127.0.0.1:6379")


@pytest.mark.parametrize("visible", [0, 1])
def test_a_gpu_share_where_torch_sees_too_few_gpus_is_refused(monkeypatch, visible):
    from simulation.runtime import federation  # noqa: PLC0415

    monkeypatch.setattr(federation, "visible_gpus", lambda: visible)
    with pytest.raises(FederationConfigError, match="give 0 to train on the CPU") as info:
        federation.refuse_unfittable({"client-resources-num-gpus": 2})
    assert info.value.key == "client-resources-num-gpus"
    if visible:
        federation.refuse_unfittable({"client-resources-num-gpus": 0.25})
    # Ray told how many GPUs it has: the user's call
    federation.refuse_unfittable({"client-resources-num-gpus": 2, "init-args-num-gpus": 2})
    monkeypatch.setattr(federation, "visible_gpus", lambda: None)  # no torch: not checked
    federation.refuse_unfittable({"client-resources-num-gpus": 2})


@pytest.mark.usefixtures("processes")
def test_run_with_more_cpus_per_client_than_cores_stops_before_anything_starts(tmp_path):
    import os  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    cores = os.cpu_count()
    home = tmp_path / "flwr-home"
    done = subprocess.run(
        [sys.executable, "-m", "simulation", "run", "--cpus-per-client", str(cores + 1),
         "--flwr-home", str(home)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert f"client-resources-num-cpus={cores + 1}: no ClientApp can start" in done.stderr
    assert "nothing ran" in done.stderr and "Traceback" not in done.stderr
    assert not home.exists()  # no SuperLink, no FLWR_HOME


def test_gpus_the_clientapps_will_not_get_are_pointed_out(tmp_path, monkeypatch):
    from simulation.runtime import federation  # noqa: PLC0415

    driver = tmp_path / "gpus"
    assert federation.nvidia_gpus(driver) == 0  # no driver: no note
    driver.mkdir()
    for bus in ("0000:01:00.0", "0000:02:00.0"):
        (driver / bus).mkdir()
    assert federation.nvidia_gpus(driver) == 2
    monkeypatch.setattr(federation, "nvidia_gpus", lambda: 2)
    note = federation.unused_gpus_note({"client-resources-num-cpus": 1})
    assert note.startswith("note: this machine has 2 NVIDIA GPU(s), but the ClientApps ask for "
                           "no share of one") and "--gpus-per-client 0.25" in note
    assert federation.unused_gpus_note({"client-resources-num-gpus": 0.25}) is None
    assert federation.unused_gpus_note({}, ray_address="127.0.0.1:6379") is None
    monkeypatch.setattr(federation, "nvidia_gpus", lambda: 0)
    assert federation.unused_gpus_note({}) is None
