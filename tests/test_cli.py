"""Every ``fedhetero`` / ``python -m simulation`` / ``python -m deploy`` sub-command has a
real --help, and the ``fedhetero`` console script runs."""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from deploy.__main__ import COMMANDS as DEPLOY_COMMANDS
from deploy.__main__ import main as deploy_main
from simulation.__main__ import COMMANDS
from simulation.__main__ import main as simulation_main
from simulation.cli import COMMANDS as FEDHETERO_COMMANDS
from simulation.cli import main as fedhetero_main
from simulation.runtime.help_format import help_with_default

REPO = Path(__file__).resolve().parents[1]

BENCHES = ["overhead", "efficiency", "aggregation", "sync-events", "import", "scale",
           "packed-workers", "layout", "heap", "deploy", "selection"]


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


def test_help_shows_every_options_default():
    parser = argparse.ArgumentParser()
    cases = {
        "--count": ({"type": int, "default": 3}, "(default: %(default)s)"),
        "--sizes": ({"nargs": "+", "default": [10, 100]}, "(default: 10 100)"),
        "--share": ({"default": "5%", "help": "of 100%%"}, "of 100%% (default: %(default)s)"),
        "--named": ({"default": 1, "help": "K (default 1: the target)"},
                    "K (default 1: the target)"),
        "--flag": ({"action": "store_true"}, None),
        "--unset": ({"default": None, "help": "optional"}, "optional"),
        "--empty": ({"action": "append", "default": []}, None),
        "--hidden": ({"default": 2, "help": argparse.SUPPRESS}, argparse.SUPPRESS),
    }
    for option, (kwargs, expected) in cases.items():
        assert help_with_default(parser.add_argument(option, **kwargs)) == expected, option
    assert help_with_default(parser.add_argument("file", nargs="?", default="x")) is None


@pytest.mark.parametrize("main, argv, expected", [
    (fedhetero_main, ["run"], ["--num-supernodes NUM_SUPERNODES", "(one data partition each; "
                                "default 10, with --quick 4)", "(default: 1)"]),
    (simulation_main, ["bench", "efficiency"], ["(default: 20)", "(default: cnn-mcmahan)"]),
    (simulation_main, ["bench", "scale"], ["(default: 10 100 1000)"]),
    (simulation_main, ["faults-table"], ["server rounds per run (default: 5)"]),
    (deploy_main, ["run"], ["SuperNodes to start (one data partition each) (default: 2)"]),
])
def test_help_texts_name_the_defaults(main, argv, expected, capsys):
    text = " ".join(help_of(main, argv, capsys).split())  # argparse wraps by the terminal width
    assert all(" ".join(part.split()) in text for part in expected), text


@pytest.mark.usefixtures("processes")
def test_the_entry_points_run():
    for module in ("simulation", "deploy"):
        proc = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                              text=True, timeout=120, check=False)
        assert proc.returncode == 0 and "COMMAND" in proc.stdout, proc.stderr


# ------------------------------------------------------------------ the fedhetero command
def test_fedhetero_has_every_simulation_command_and_deploy(capsys):
    assert set(FEDHETERO_COMMANDS) == set(COMMANDS)
    text = help_of(fedhetero_main, [], capsys)
    assert text.startswith("usage: fedhetero ")
    assert all(f"    {name}" in text for name in [*FEDHETERO_COMMANDS, "deploy"]), text


@pytest.mark.parametrize("command", sorted(FEDHETERO_COMMANDS))
def test_every_fedhetero_command_has_its_tools_options(command, capsys):
    text = help_of(fedhetero_main, [command], capsys)
    assert f"usage: fedhetero {command}" in text
    assert options_of(text) == options_of(help_of(simulation_main, [command], capsys))


def options_of(help_text: str) -> list[str]:
    """The option / sub-command lines of a --help text (not the usage, which wraps by prog,
    nor the description)."""
    lines = help_text.splitlines()
    first = next(i for i, line in enumerate(lines)
                 if line in ("positional arguments:", "options:"))
    return [line.strip() for line in lines[first:] if line.startswith("  ")]


def fedhetero_child(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simulation.cli", *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.usefixtures("processes")
def test_fedhetero_bench_and_deploy_sub_commands(capsys):
    for name in BENCHES:
        text = help_of(fedhetero_main, ["bench", name], capsys)
        assert f"usage: fedhetero bench {name}" in text and "--" in text
    for command in DEPLOY_COMMANDS:  # python -m deploy in a child process, named fedhetero
        done = fedhetero_child(["deploy", command, "--help"])
        assert done.returncode == 0, done.stderr
        assert f"usage: fedhetero deploy {command}" in done.stdout
        assert "--num-supernodes" in done.stdout and "--tls" in done.stdout


@pytest.mark.usefixtures("processes")
def test_fedhetero_usage_errors(capsys):
    for argv, expected in ((["run", "-c", "no-equals-sign"], "expected KEY=VALUE"),
                           (["no-such-command"], "invalid choice"),
                           ([], "required: COMMAND")):
        with pytest.raises(SystemExit) as exit_info:
            fedhetero_main(argv)
        assert exit_info.value.code == 2, argv
        assert expected in capsys.readouterr().err, argv
    done = fedhetero_child(["deploy"])  # deploy's own usage error, its exit code
    assert done.returncode == 2 and "required: COMMAND" in done.stderr


def test_fedhetero_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        fedhetero_main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("fedhetero ")


def modules_loaded_by(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys\nprint(*sys.modules)"],
                         cwd=REPO, capture_output=True, text=True, timeout=120, check=True)
    return set(out.stdout.split())


@pytest.mark.usefixtures("processes")
def test_fedhetero_imports_only_the_chosen_tool():
    top = modules_loaded_by("import simulation.cli as c; c.build_parser()")
    assert not top & {"torch", "fedapp", "task", "deploy", "simulation.sweep", "simulation.run"}
    sweep = modules_loaded_by("import simulation.cli as c; c.build_parser('sweep')")
    assert "simulation.sweep" in sweep and not sweep & {"deploy", "simulation.bench"}
    bench = modules_loaded_by("import simulation.cli as c; c.build_parser('bench')")
    assert "simulation.bench.deploy" in bench and not bench & {"deploy", "deploy.cluster"}


def test_the_console_script_entry_point_is_fedhetero_main():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["fedhetero"].partition(":")
    assert getattr(importlib.import_module(module), function) is fedhetero_main


@pytest.mark.usefixtures("processes")
def test_the_installed_console_script_runs():
    """The ``fedhetero`` script pip installed next to this Python (``make test`` installs the
    project), importing this checkout's code."""
    script = Path(sys.executable).parent / "fedhetero"
    assert script.is_file(), (f"no {script}: install the project (pip install -e '.[app,dev]', "
                              "as make test does) to get the fedhetero command")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    for argv in (["--help"], ["sweep", "--help"], ["deploy", "run", "--help"]):
        proc = subprocess.run([str(script), *argv], capture_output=True, text=True, env=env,
                              cwd=REPO, timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(f"usage: fedhetero {' '.join(argv[:-1])}".rstrip()), argv


def test_strategies_and_keys_list_what_the_app_runs(capsys):
    """``fedhetero strategies`` names every strategy with its paper; ``fedhetero keys
    --strategy NAME`` the keys the app and NAME read, each with its default."""
    from fedapp.config_keys import ALL, APP, KEYS, SUMMARIES

    assert set(SUMMARIES) == set(ALL)
    assert fedhetero_main(["strategies", "--names-only"]) == 0
    assert capsys.readouterr().out.split() == list(ALL)
    assert fedhetero_main(["strategies"]) == 0
    listing = capsys.readouterr().out
    assert "FedBuff (Nguyen et al. 2022)" in listing and "Flower's class" in listing
    assert fedhetero_main(["keys", "--strategy", "fedbuff"]) == 0
    text = capsys.readouterr().out
    read = [k.name for k in KEYS if APP in k.used_by or "fedbuff" in k.used_by]
    assert "fedbuff-buffer-size = 10" in text and "proximal-mu" not in text
    assert f"{len(read)} keys read with strategy=fedbuff" in text
    assert fedhetero_main(["keys"]) == 0
    assert f"{len(KEYS)} keys;" in capsys.readouterr().out


def test_keys_of_a_strategy_show_its_own_in_full_and_the_rest_in_a_line_each(capsys):
    """``fedhetero keys --strategy fedprox``: its own key with its doc first, the keys it
    shares with other strategies one line each, the app's keys by name only."""
    from fedapp.config_keys import APP, KEYS

    assert fedhetero_main(["keys", "--strategy", "fedprox"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["# fedprox's own keys", "proximal-mu = 0.01    (a number >= 0)"]
    assert lines[2].startswith("    FedProx's mu")
    assert "weighting = 'examples'    (one of examples, uniform, pre-erratum, scheme-i, " \
           "scheme-ii)" in lines
    app = [k.name for k in KEYS if APP in k.used_by]
    assert not any(line.startswith("dataset = ") for line in lines)  # the app's: names only
    assert "tracking-dir" in " ".join(lines) and len(app) > 30
    assert len(lines) < 60  # was 216: every key's doc


def test_a_closed_pipe_ends_a_listing_with_exit_code_1_and_no_traceback(monkeypatch):
    """``fedhetero keys | head``: the reader goes away; stdout is pointed at /dev/null so
    that the interpreter's last flush does not raise either."""
    import simulation.cli as cli  # noqa: PLC0415

    def closed_pipe(args):
        raise BrokenPipeError(32, "Broken pipe")

    pointed = []
    monkeypatch.setattr(cli, "run_tool", closed_pipe)
    monkeypatch.setattr(cli.os, "dup2", lambda fd, to: pointed.append(to))
    monkeypatch.setattr(cli.sys, "stdout", type("Out", (), {"fileno": lambda self: 1})())
    assert cli.main(["keys"]) == 1 and pointed == [1]

