"""Flower's deployment runtime on loopback under real process faults: a SuperNode SIGKILLed
mid-round, the SuperLink SIGKILLed mid-run and resumed from its checkpoint (the model of an
uninterrupted run, bit for bit), SuperNodes whose data is missing or corrupt.

One deployment (a SuperLink and 3 SuperNodes, one torch thread each) serves the whole
module; every wait is bounded, every process is one this module started (or one of its
descendants, collected before any signal), stopped by PID and checked gone at the end.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest
from flwr.common.constant import HEARTBEAT_DEFAULT_INTERVAL, HEARTBEAT_PATIENCE

from deploy.cluster import DeploySpec, LocalDeployment
from deploy.layout import Layout
from deploy.runner import run_on_connection
from fedapp.checkpoint import load_checkpoint
from fedapp.run_log import read_rounds
from simulation.runtime import descendants, is_alive, stop_pids
from strategies import contract as C
from task.data import IDX_FILES
from tests.deployed import run_in_process

FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
NODES = 3
CONFIG = {"num-server-rounds": 3, "partition": "iid", "model": "cnn-small", "local-steps": 5,
          "eval-batch-size": 2000, "min-available-nodes": NODES, "seed": 1,
          "round-timeout": 600.0}
JOINED = "SuperNode ID: "

pytestmark = [pytest.mark.skipif(
    not all(any((FASHION_MNIST / f"{stem}{gz}").is_file() for gz in ("", ".gz"))
            for stem in IDX_FILES.values()),
    reason="needs Fashion-MNIST in /usr/share/datasets/fashion-mnist (dataset-fashion-mnist)"),
    pytest.mark.usefixtures("deployment")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A SuperLink and 3 SuperNodes for the module; stopped (and checked gone) after it."""
    work = tmp_path_factory.mktemp("deploy-faults")
    deployment = LocalDeployment(
        DeploySpec(num_supernodes=NODES, num_threads=1, data_dir=str(FASHION_MNIST)),
        Layout(work / "deploy"), start_timeout=240)
    deployment.extra_pids = []  # descendants we signalled ourselves, for the final check
    try:
        yield deployment.start()
    finally:
        pids = [p for s in deployment.started for p in [s.proc.pid, *descendants(s.proc.pid)]]
        pids += deployment.extra_pids
        deployment.stop()
        stop_pids([pid for pid in deployment.extra_pids if is_alive(pid)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(is_alive(pid) for pid in pids):
            time.sleep(0.5)
        assert not [pid for pid in pids if is_alive(pid)], "processes left after stop()"


def deployed(cluster: LocalDeployment, out: Path, timeout: float = 1500, **overrides):
    """One ``flwr run`` on the cluster: (result, run directory)."""
    result = run_on_connection(cluster.spec.connection, cluster.cli_env,
                               {**CONFIG, "output-dir": str(out), **overrides},
                               timeout=timeout, capture=True)
    runs = sorted(out.iterdir()) if out.is_dir() else []
    return result, (runs[-1] if runs else None)


def in_background(fn, *args, **kwargs) -> tuple[threading.Thread, dict]:
    box: dict = {}

    def target() -> None:
        box["value"] = fn(*args, **kwargs)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout} s for {what}")
        time.sleep(0.2)


def log_of(cluster: LocalDeployment, name: str) -> str:
    return (cluster.layout.logs / f"{name}.log").read_text(errors="replace")


def sigkill_tree(cluster: LocalDeployment, pid: int) -> None:
    """SIGKILL ``pid`` and everything below it (collected first), as a crash would."""
    tree = [pid, *descendants(pid)]
    cluster.extra_pids += tree
    for each in tree:
        try:
            os.kill(each, signal.SIGKILL)
        except ProcessLookupError:
            pass


def restart_supernode(cluster: LocalDeployment, partition_id: int, **kwargs) -> None:
    """Start SuperNode ``partition_id`` (again) and wait until the SuperLink accepted it."""
    name = f"supernode-{partition_id}"
    before = log_of(cluster, name).count(JOINED) if (cluster.layout.logs / f"{name}.log").exists() else 0
    node = cluster.start_supernode(partition_id, **kwargs)
    wait_until(lambda: log_of(cluster, name).count(JOINED) > before or node.proc.poll() is not None,
               240, f"SuperNode {partition_id} to join")
    assert node.proc.poll() is None, node.log_tail()


def holds_a_message_of(log: str, run_id: str) -> bool:
    """Whether a SuperNode's log shows a train message of run ``run_id`` it received and has
    neither answered nor dropped (Flower: "Run ID ... is not in `RUNNING` status")."""
    received = len(re.findall(rf"\[RUN {run_id}\]\s*\n.*Receiving: train message", log))
    answered = len(re.findall(rf"\[RUN {run_id}\]\s*\n.*Sending: train message", log))
    return received > answered + log.count(f"Run ID {run_id} is not in `RUNNING` status")


def digests(run_dir: Path) -> list[str]:
    return [r[C.LOG_MODEL_SHA256] for r in read_rounds(run_dir)]


def what_differed(run_dir: Path, output: str) -> str:
    """For a failed digest comparison: each round's client counts and the run's warnings."""
    keys = (C.LOG_CLIENTS_SAMPLED, C.LOG_CLIENTS_RECEIVED, C.LOG_CLIENTS_FAILED)
    rounds = [f"round {r[C.LOG_ROUND]}: " + ", ".join(f"{k}={r.get(k)}" for k in keys)
              for r in read_rounds(run_dir)]
    warnings = [line for line in output.splitlines() if "WARNING" in line or "ERROR" in line]
    return "\n".join(rounds + warnings[-30:])


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run of CONFIG, in process (the same bits as deployed, one torch thread
    per client: tests/test_runtime_matrix.py): its run directory."""
    out = tmp_path_factory.mktemp("reference")
    run_dir = run_in_process({**CONFIG, "output-dir": str(out)}, NODES)
    assert len(digests(run_dir)) == CONFIG["num-server-rounds"] + 1
    return run_dir


@pytest.mark.timeout(3000)
def test_superlink_killed_mid_run_resumes_from_its_checkpoint(cluster, reference, tmp_path):
    thread, box = in_background(deployed, cluster, tmp_path / "first", **{"checkpoint-every": 1})

    def checkpointed() -> bool:
        runs = list((tmp_path / "first").glob("*/checkpoint.json"))
        return bool(runs) and load_checkpoint(runs[0].parent)["round"] >= 1

    wait_until(checkpointed, 600, "the checkpoint of round 1")
    (first,) = (tmp_path / "first").iterdir()
    link = cluster.started[0]
    sigkill_tree(cluster, link.proc.pid)  # the SuperLink, its SuperExec and the ServerApp
    killed_at = time.monotonic()
    link.proc.wait(timeout=30)
    thread.join(timeout=120)
    interrupted = read_rounds(first)
    assert interrupted[-1][C.LOG_ROUND] < CONFIG["num-server-rounds"]  # really mid-run
    cluster.start_superlink()  # same port and state database: the SuperNodes carry on
    first_id = first.name.rsplit("-run", 1)[1]
    try:
        cluster.flwr("stop", first_id, cluster.spec.connection)
    except RuntimeError as err:  # the restarted SuperLink may have finished it already
        if "Run is already finished" not in str(err):  # (its ServerApp's heartbeat lapsed)
            raise
    # a SuperNode still retrying the killed run's message (Flower's backoff, up to ~16 s a
    # try) is not back when the resumed round starts, and the round goes on without it
    # (seen once in CI: 1 of 3 clients failed); the same model needs all three, so wait
    wait_until(lambda: not any(holds_a_message_of(log_of(cluster, f"supernode-{i}"), first_id)
                               for i in range(NODES)),
               180, "the SuperNodes to drop the stopped run's messages")
    # each SuperNode's last heartbeat before the kill keeps it 'online' in the database for
    # up to HEARTBEAT_PATIENCE x HEARTBEAT_DEFAULT_INTERVAL s; a node still in its reconnect
    # backoff past that gets the resumed run's messages answered 'node unavailable' (seen
    # in CI: a resumed round's model differed). Past that window 'online' means it
    # heartbeated to the restarted SuperLink.
    stale = HEARTBEAT_PATIENCE * HEARTBEAT_DEFAULT_INTERVAL
    wait_until(lambda: time.monotonic() - killed_at > stale + 1
               and cluster.node_statuses().count("online") >= NODES,
               stale + 180, "the SuperNodes to heartbeat to the restarted SuperLink")
    result, resumed = deployed(cluster, tmp_path / "resumed", **{"resume-from": str(first)})
    assert result.status == "finished:completed", result.output[-4000:]
    assert json.loads((resumed / "config.json").read_text())["resumed-from"]["round"] >= 1
    # every round, the resumed ones included
    assert digests(resumed) == digests(reference), what_differed(resumed, result.output)
    assert (resumed / "final_model.pt").read_bytes() == (reference / "final_model.pt").read_bytes()


@pytest.mark.timeout(3000)
def test_supernode_killed_mid_round_the_round_completes_and_it_trains_again(cluster, tmp_path):
    name = "supernode-2"
    received = log_of(cluster, name).count("Receiving: train message")
    thread, box = in_background(deployed, cluster, tmp_path)
    wait_until(lambda: log_of(cluster, name).count("Receiving: train message") > received,
               600, "SuperNode 2's first train message")
    node = [s for s in cluster.started if s.name == "SuperNode 2"][-1]
    superexec = [s for s in cluster.started if s.name == "SuperExec 2"][-1]
    wait_until(lambda: descendants(superexec.proc.pid), 60, "SuperNode 2's ClientApp to start")
    followers = [superexec.proc.pid, *descendants(superexec.proc.pid)]  # + the training ClientApp
    cluster.extra_pids += followers
    sigkill_tree(cluster, node.proc.pid)  # mid-round: its ClientApp is training
    node.proc.wait(timeout=30)
    # its SuperExec and the ClientApp it forked end by themselves (they watch their parent)
    wait_until(lambda: not any(is_alive(pid) for pid in followers), 60,
               "SuperNode 2's SuperExec and ClientApp to exit after it")
    restart_supernode(cluster, 2)  # a new node id; the server queries it like any new node
    thread.join(timeout=800)
    result, run_dir = box["value"]
    assert result.status == "finished:completed", result.output[-4000:]
    rounds = read_rounds(run_dir)[1:]
    killed = next(r for r in rounds if r[C.LOG_CLIENTS_FAILED] >= 1)
    assert killed[C.LOG_ROUND] == 1 and killed[C.LOG_CLIENTS_RECEIVED] == NODES - 1
    assert killed[C.LOG_WALL_SECONDS] < CONFIG["round-timeout"]  # done with the others
    assert rounds[-1][C.LOG_CLIENTS_RECEIVED] == NODES  # the restarted SuperNode trains again
    assert rounds[-1][C.LOG_CLIENTS_FAILED] == 0
    assert "Sending: train message" in log_of(cluster, name).rsplit(JOINED, 1)[1]


@pytest.mark.timeout(3000)
def test_supernodes_with_missing_or_corrupt_data_fail_alone_with_errors_naming_the_fix(
        cluster, tmp_path):
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    for stem in IDX_FILES.values():
        source = next(FASHION_MNIST / f"{stem}{gz}" for gz in ("", ".gz")
                      if (FASHION_MNIST / f"{stem}{gz}").is_file())
        shutil.copy(source, corrupt / source.name)
    images = next(corrupt.glob("train-images*"))
    images.write_bytes(images.read_bytes()[: images.stat().st_size // 2])  # truncated
    missing = tmp_path / "unmounted"  # a data folder that is not there
    cluster.stop_supernode(1)
    cluster.stop_supernode(2)
    restart_supernode(cluster, 1, data_dir=str(missing))
    restart_supernode(cluster, 2, data_dir=str(corrupt))
    result, run_dir = deployed(cluster, tmp_path / "runs", **{"num-server-rounds": 2})
    assert result.status == "finished:completed", result.output[-4000:]
    rounds = read_rounds(run_dir)
    assert [r[C.LOG_ROUND] for r in rounds] == [0, 1, 2] and (run_dir / "final_model.pt").is_file()
    for r in rounds[1:]:
        assert (r[C.LOG_CLIENTS_RECEIVED], r[C.LOG_CLIENTS_FAILED]) == (1, NODES - 1)
        assert r[C.LOG_MODEL_KEPT] is False  # partition 0's update is not lost
    assert rounds[-1][C.LOG_LOSS] < rounds[0][C.LOG_LOSS]
    server_log = result.output
    assert f"data-dir='{missing}'" in server_log and "--node-config" in server_log
    assert str(images) in server_log and "delete it and reinstall" in server_log
