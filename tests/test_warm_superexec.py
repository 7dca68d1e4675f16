"""deploy.warm_superexec: ClientApp tasks forked from a warm SuperExec, other tasks as
Flower launches them, Flower's loop still taking the executor from the name we replace.
The whole path (real SuperLink, SuperNodes in --isolation process, forked ClientApps) runs
in tests/test_deploy_e2e.py and tests/test_deploy_faults.py, which use it by default."""

from __future__ import annotations

import inspect
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from flwr.supercore.constant import TaskType  # noqa: E402
from flwr.supercore.superexec import run_superexec as flower_superexec  # noqa: E402
from flwr.supercore.superexec.executor import LaunchResultStatus  # noqa: E402
from flwr.supercore.superexec.executor.types import ExecutionSpec  # noqa: E402

from deploy import warm_superexec  # noqa: E402
from deploy.cluster import DeploySpec  # noqa: E402

pytestmark = [pytest.mark.skipif(not hasattr(os, "fork"), reason="fork-based executor"), pytest.mark.usefixtures("deployment")]


def spec(task_type: TaskType = TaskType.CLIENT_APP, **kw) -> ExecutionSpec:
    fields = dict(task_type=task_type, runtime_api_address="127.0.0.1:1", token="ab" * 8,
                  insecure=True, root_certificates_path=None, runtime_dependency_install=False,
                  parent_pid=os.getpid(), suppress_output=False, task_id=7)
    return ExecutionSpec(**{**fields, **kw})


def wait_reaped(executor: warm_superexec.ForkExecutor, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while executor.children and time.monotonic() < deadline:
        executor.reconcile()
        time.sleep(0.05)
    assert not executor.children, "forked ClientApp child not reaped"


def test_clientapp_task_runs_flowers_run_clientapp_in_a_forked_child(tmp_path, monkeypatch):
    out = tmp_path / "child.txt"

    def fake_run_clientapp(**kwargs):  # stands in for Flower's, which needs a SuperNode
        out.write_text(f"{os.getpid()} {kwargs['token']} {kwargs['runtime_api_address']} "
                       f"{kwargs['parent_pid']} {kwargs['insecure']}")
        raise SystemExit(0)  # Flower's run_clientapp always ends in sys.exit

    monkeypatch.setattr(warm_superexec, "run_clientapp", fake_run_clientapp)
    executor = warm_superexec.ForkExecutor()
    result = executor.launch(spec())
    assert result.status == LaunchResultStatus.ACCEPTED
    (child,) = executor.children
    wait_reaped(executor)
    pid, token, address, parent, insecure = out.read_text().split()
    assert int(pid) == child != os.getpid()
    # Flower's own parent monitor is off (a zombie passes it): exit_with watches instead
    assert (token, address, parent, insecure) == ("ab" * 8, "127.0.0.1:1", "None", "True")


def test_a_failing_clientapp_child_exits_and_is_reaped(tmp_path, monkeypatch):
    def broken(**_kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(warm_superexec, "run_clientapp", broken)
    executor = warm_superexec.ForkExecutor()
    assert executor.launch(spec()).status == LaunchResultStatus.ACCEPTED
    wait_reaped(executor)


def test_child_exit_code_is_run_clientapps(monkeypatch):
    monkeypatch.setattr(warm_superexec, "run_clientapp",
                        lambda **_kw: (_ for _ in ()).throw(SystemExit(3)))
    assert warm_superexec._run_child(spec()) == 3
    monkeypatch.setattr(warm_superexec, "run_clientapp", lambda **_kw: None)
    assert warm_superexec._run_child(spec()) == 0


def test_other_task_types_start_as_flowers_subprocesses(monkeypatch):
    launched = []
    monkeypatch.setattr(warm_superexec.SubprocessExecutor, "launch",
                        lambda self, s: launched.append(s.task_type) or "subprocess")
    executor = warm_superexec.ForkExecutor()
    assert executor.launch(spec(TaskType.SERVER_APP)) == "subprocess"
    assert launched == [TaskType.SERVER_APP] and not executor.children


def test_flowers_superexec_loop_still_takes_its_executor_from_get_executor():
    """run() replaces run_superexec.get_executor: a Flower upgrade that moves it fails here."""
    assert callable(flower_superexec.get_executor)
    assert "get_executor(" in inspect.getsource(flower_superexec.run_superexec)
    params = inspect.signature(flower_superexec.run_superexec).parameters
    assert {"runtime_api_address", "insecure", "root_certificates_path",
            "parent_pid"} <= set(params)


def test_preload_names_a_missing_module_and_goes_on():
    warm_superexec.preload(["numpy", "no_such_module_xyz"])  # logs, does not raise
    assert "numpy" in sys.modules


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="zombie state from /proc")
def test_a_dead_unreaped_parent_counts_as_gone():
    """A SIGKILLed SuperNode that its starter has not waited for yet is a zombie: the
    SuperExec must still see it gone (os.kill(pid, 0) alone says it runs)."""
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert not warm_superexec.process_gone(running.pid)
        running.kill()
        deadline = time.monotonic() + 10
        while not warm_superexec.process_gone(running.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert warm_superexec.process_gone(running.pid)  # a zombie: not yet reaped
        os.kill(running.pid, 0)  # ... which Flower's check would call alive
    finally:
        running.kill()
        running.wait()
    assert warm_superexec.process_gone(running.pid)


def ignore_sigint() -> None:
    """What a shell script's ``cmd &`` does to the command's SIGINT."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("sigint", ["default", "ignored by the starter"])
def test_a_superexec_whose_supernode_is_already_gone_exits_without_a_traceback(sigint):
    """A SuperNode refused by the SuperLink exits within a second of starting its SuperExec;
    the SIGINT that follows lands before Flower's loop installs its handlers and must not
    print a traceback into the SuperNode's log (it once pushed the refusal out of view), nor
    be lost where the SuperNode's starter ignored SIGINT (it once left the SuperExec running)."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=30)
    done = subprocess.run(
        [sys.executable, "-m", "deploy.warm_superexec", "--runtime-api-address", "127.0.0.1:9",
         "--insecure", "--parent-pid", str(gone.pid)],
        cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=120,
        preexec_fn=ignore_sigint if sigint != "default" else None)
    assert f"its SuperNode {gone.pid} is gone; exiting" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode in (0, 130)


def test_the_superexec_without_tls_or_insecure_says_which_flag(capsys):
    with pytest.raises(SystemExit, match="--root-certificates CA_CERT.*--insecure"):
        warm_superexec.main(["--runtime-api-address", "127.0.0.1:9094"])


def test_importing_it_does_not_import_the_app():
    """What the parent imports, every forked ClientApp inherits: the app's own modules must
    come from the installed FAB, so the launcher must not import them."""
    code = ("import sys, deploy.warm_superexec; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'fedapp', 'strategies', 'task', 'simulation'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.strip() == "[]"


def test_local_deployments_use_it_by_default():
    assert DeploySpec().warm_clientapps is True


def test_it_patches_flower_and_forgets_the_patch_module():
    code = ("import sys, deploy.warm_superexec as w; "
            "from flwr.supercore.inflatable import inflatable_utils as u; "
            "from flwr.supercore.superexec import run_superexec as r; "
            "e = w.ForkExecutor(); w.patch_flower(e); "
            "print(u.pull_objects.__kwdefaults__['initial_backoff'], "
            "r.get_executor('subprocess') is e, "
            "any(m.split('.')[0] in ('fedapp',) for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.split() == ["0.05", "True", "False"]


def test_deploy_run_flags_choose_flowers_processes_and_an_in_memory_superlink():
    import argparse  # noqa: PLC0415

    from deploy.run import add_arguments, spec_of  # noqa: PLC0415

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    default, _ = spec_of(parser.parse_args([]))
    assert (default.warm_clientapps, default.superlink_database) == (True, True)
    plain, _ = spec_of(parser.parse_args(["--flower-clientapps", "--in-memory-superlink"]))
    assert (plain.warm_clientapps, plain.superlink_database) == (False, False)


def test_the_superlink_keeps_its_state_in_a_file_unless_asked_for_memory(monkeypatch, tmp_path):
    from types import SimpleNamespace  # noqa: PLC0415

    from deploy import cluster  # noqa: PLC0415
    from deploy.layout import Layout  # noqa: PLC0415

    argvs = []
    monkeypatch.setattr(cluster, "start_process", lambda name, argv, *_: (
        argvs.append(argv) or SimpleNamespace(name=name, proc=SimpleNamespace(pid=1))))
    monkeypatch.setattr(cluster, "wait_for_port", lambda *_args, **_kwargs: None)
    for database in (True, False):
        spec = DeploySpec(superlink_database=database)
        cluster.LocalDeployment(spec, Layout(tmp_path / str(database))).start_superlink()
    on_disk, in_memory = argvs
    assert on_disk[on_disk.index("--database") + 1].endswith("state.db")
    assert "--database" not in in_memory


# A process whose main thread waits forever and whose SIGINT does nothing (what a forked
# ClientApp stuck in its inherited shutdown looks like); exit_with(at_once) must end it.
STUCK_CHILD = """
import signal, sys, threading
from deploy.warm_superexec import exit_with
signal.signal(signal.SIGINT, signal.SIG_IGN)
exit_with(int(sys.argv[1]), interval=0.05, at_once=True)
print("watching", flush=True)
lock = threading.Lock()
lock.acquire()
lock.acquire()  # never returns
"""


def test_a_forked_clientapp_ends_at_once_when_its_superexec_is_gone():
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    child = subprocess.Popen([sys.executable, "-c", STUCK_CHILD, str(parent.pid)],
                             cwd=Path(__file__).resolve().parents[1], text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == "watching"
        parent.kill()
        parent.wait(timeout=30)
        assert child.wait(timeout=30) == 1
        assert f"its SuperExec {parent.pid} is gone" in child.stderr.read()
    finally:
        for proc in (parent, child):
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
