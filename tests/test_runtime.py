"""simulation.runtime without Flower: overrides, streaming with a timeout, process trees."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from simulation.runtime import (flwr_run_command, is_alive, parse_overrides, process_tree,
                                run_id_of, start_process, stop_processes, stream_command,
                                to_flwr_config)


def test_overrides_are_typed_and_written_back_as_toml():
    values = parse_overrides(["lr=0.05", "rounds=3", "iid=true", "strategy='fednova'"])
    assert values == {"lr": 0.05, "rounds": 3, "iid": True, "strategy": "fednova"}
    assert to_flwr_config(values) == "lr=0.05 rounds=3 iid=true strategy='fednova'"
    with pytest.raises(ValueError, match="expected KEY=VALUE"):
        parse_overrides(["lr"])


def test_flwr_run_command_puts_the_connection_after_the_app():
    cmd = flwr_run_command({"lr": 0.1}, app_dir=Path("/app"), connection="remote")
    assert cmd[1:4] == ["run", "/app", "remote"] and cmd[-1] == "--stream"
    assert "--federation-config" not in cmd


def test_stream_command_keeps_every_line_and_calls_back(tmp_path, capsys):
    seen = []
    code = "print('a'); print('Successfully started run 42')"
    output = stream_command([sys.executable, "-c", code], {}, tmp_path, capture=True,
                            on_line=seen.append)
    assert output == "a\nSuccessfully started run 42\n" and seen == ["a\n", output[2:]]
    assert run_id_of(output) == 42 and capsys.readouterr().out == ""


def test_stream_command_stops_a_command_at_its_timeout(tmp_path):
    code = "import time; print('up', flush=True); time.sleep(60)"
    started = time.monotonic()
    output = stream_command([sys.executable, "-c", code], {}, tmp_path, timeout=1.5, capture=True,
                            timeout_note="give it more time")
    assert time.monotonic() - started < 30
    assert output.startswith("up\n") and "exceeded 1.5 s" in output
    assert "give it more time" in output


def test_stop_processes_ends_the_whole_tree(tmp_path):
    code = ("import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "time.sleep(60)")
    started = start_process("parent", [sys.executable, "-c", code], {}, tmp_path,
                            tmp_path / "log.txt")
    deadline = time.monotonic() + 20
    while len(process_tree([started.proc.pid])) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    tree = process_tree([started.proc.pid])
    assert len(tree) == 2
    stop_processes([started], timeout=5)
    assert not [pid for pid in tree if is_alive(pid)]
