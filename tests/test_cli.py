"""Every ``python -m simulation`` / ``python -m deploy`` sub-command has a real --help."""

from __future__ import annotations

import subprocess
import sys

import pytest

from deploy.__main__ import COMMANDS as DEPLOY_COMMANDS
from deploy.__main__ import main as deploy_main
from simulation.__main__ import COMMANDS
from simulation.__main__ import main as simulation_main

BENCHES = ["overhead", "efficiency", "aggregation", "sync-events", "import", "deploy"]


def help_of(main, argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def test_top_level_help_lists_every_command(capsys):
    text = help_of(simulation_main, [], capsys)
    assert all(name in text for name in COMMANDS)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_has_its_own_options(command, capsys):
    text = help_of(simulation_main, [command], capsys)
    assert f"usage: python -m simulation {command}" in text
    options = [line for line in text.splitlines() if line.strip().startswith("-")]
    assert len(options) >= 2 or command == "bench", text  # more than -h


def test_bench_lists_and_documents_its_benchmarks(capsys):
    text = help_of(simulation_main, ["bench"], capsys)
    assert all(name in text for name in BENCHES)
    for name in BENCHES:
        sub = help_of(simulation_main, ["bench", name], capsys)
        assert f"usage: python -m simulation bench {name}" in sub and "--" in sub


def test_a_bad_run_config_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        simulation_main(["run", "-c", "no-equals-sign"])
    assert exit_info.value.code == 2
    assert "expected KEY=VALUE" in capsys.readouterr().err


def test_deploy_commands_have_real_help(capsys):
    assert "run" in help_of(deploy_main, [], capsys)
    for command in DEPLOY_COMMANDS:
        text = help_of(deploy_main, [command], capsys)
        assert "--num-supernodes" in text and "--tls" in text


def test_the_entry_points_run():
    for module in ("simulation", "deploy"):
        proc = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                              text=True, timeout=120, check=False)
        assert proc.returncode == 0 and "COMMAND" in proc.stdout, proc.stderr
