"""flower_patches: every patch of Flower internals, opt-in, pinned to the Flower it was written
for. The first tests fail on any other Flower version, or where a patched function's
signature or literal changed: re-read the patched Flower code, then update flower_patches.py
and the pins here. The deployed runs in tests/test_deploy_e2e.py and
tests/test_deploy_faults.py go through the patches end to end."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from types import SimpleNamespace

import flwr
import pytest
from flwr.supercore.constant import ExecutorType
from flwr.supercore.inflatable import inflatable_utils
from flwr.supercore.superexec import run_superexec
from flwr.supercore.superexec.executor import SubprocessExecutor
from flwr.supernode import start_client_internal

from deploy.supernode import IDLE_PULL_ENV, idle_pull_seconds
from fedapp import flower_patches as P
from tests.user_project import PYPROJECT, REPO

# (name, kind, default) of the keyword-only parameters whose defaults shorten_object_pulls
# replaces, as Flower 1.42.0 declares them in both pull functions
PULL_PARAMETERS = [["max_concurrent_pulls", "KEYWORD_ONLY", 2], ["max_time", "KEYWORD_ONLY", 7200],
                   ["max_tries_per_object", "KEYWORD_ONLY", 500],
                   ["initial_backoff", "KEYWORD_ONLY", 1], ["backoff_cap", "KEYWORD_ONLY", 10]]
GET_EXECUTOR_PARAMETERS = ["executor_type", "executor_config", "insecure",
                           "root_certificates_path"]
# What this Flower declares, read in a fresh interpreter: in this one a ServerApp run
# in-process by an earlier test has asked for shorten_object_pulls already.
DECLARED = """
import inspect, json, re, flwr
from flwr.supercore.inflatable import inflatable_utils as u
from flwr.supercore.superexec import run_superexec as r
from flwr.supernode import start_client_internal as s
names = {"max_concurrent_pulls", "max_time", "max_tries_per_object", "initial_backoff",
         "backoff_cap"}
print(json.dumps({
    "version": flwr.__version__,
    "backoff": [u.PULL_INITIAL_BACKOFF, u.PULL_BACKOFF_CAP],
    "pulls": {f.__name__: [[p.name, p.kind.name, p.default]
                           for p in inspect.signature(f).parameters.values() if p.name in names]
              for f in (u.pull_objects, u.pull_and_inflate_object_from_tree)},
    "sleeps": re.findall(r"time\\.sleep\\(([^)]*)\\)", inspect.getsource(s)),
    "get_executor": list(inspect.signature(r.get_executor).parameters),
    "get_executor_calls": inspect.getsource(r.run_superexec).count("get_executor("),
}))
"""


@pytest.fixture(scope="module")
def declared(processes) -> dict:
    out = subprocess.run([sys.executable, "-c", DECLARED], cwd=REPO, capture_output=True,
                         text=True, timeout=120, check=True)
    return json.loads(out.stdout)


@pytest.fixture
def restore_flower(monkeypatch):
    """Put Flower's keyword defaults, its time module and its executor factory back."""
    for fn in P.pull_functions():
        monkeypatch.setattr(fn, "__kwdefaults__", dict(fn.__kwdefaults__))
    monkeypatch.setattr(start_client_internal, "time", start_client_internal.time)
    monkeypatch.setattr(run_superexec, "get_executor", run_superexec.get_executor)


# ------------------------------------------------------------------ the pins
def test_this_is_the_flower_the_patches_were_written_for(declared):
    assert flwr.__version__ == declared["version"] == P.FLOWER_VERSION, (
        f"flower_patches.py was written for flwr {P.FLOWER_VERSION}, this is flwr "
        f"{flwr.__version__}: re-read inflatable_utils.pull_objects / "
        "pull_and_inflate_object_from_tree, supernode/start_client_internal.py's sleeps and "
        "supercore/superexec/run_superexec.get_executor, then update flower_patches.py, "
        "FLOWER_VERSION and the pins in this file")


def test_the_pull_functions_keyword_defaults_are_the_ones_we_replace(declared):
    assert declared["backoff"] == [1, 10]  # what the docs say Flower waits
    assert declared["pulls"] == {"pull_objects": PULL_PARAMETERS,
                                 "pull_and_inflate_object_from_tree": PULL_PARAMETERS}
    P.check_object_pulls()


def test_the_supernode_loop_sleeps_the_literals_we_map(declared):
    assert declared["sleeps"] == ["3", "0.5", "0.5"]
    assert (P.FLOWER_IDLE_SLEEP, P.FLOWER_REPLY_SLEEP) == (3, 0.5)
    P.check_supernode_waits()


def test_the_superexec_loop_builds_its_executor_with_get_executor(declared):
    assert declared["get_executor"] == GET_EXECUTOR_PARAMETERS
    assert declared["get_executor_calls"] == 1, "run_superexec no longer calls get_executor once"
    P.check_superexec_executor()


@pytest.mark.usefixtures("processes")
def test_importing_the_module_patches_nothing():
    """Opt-in: a fresh process that imports flower_patches has Flower's own functions."""
    code = """
import time
from types import SimpleNamespace
from flwr.supercore.inflatable import inflatable_utils as u
from flwr.supercore.superexec import run_superexec as r
from flwr.supernode import start_client_internal as s
before = ([dict(f.__kwdefaults__) for f in (u.pull_objects, u.pull_and_inflate_object_from_tree)],
          s.time, r.get_executor)
from fedapp import flower_patches
after = ([dict(f.__kwdefaults__) for f in (u.pull_objects, u.pull_and_inflate_object_from_tree)],
         s.time, r.get_executor)
print(before == after, s.time is time, before[0][0]['initial_backoff'])
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=120, check=True)
    assert out.stdout.split() == ["True", "True", "1"]


# ------------------------------------------------------------------ the checks fail loudly
def test_a_pull_function_without_our_keywords_is_named(restore_flower):
    fn = inflatable_utils.pull_objects
    fn.__kwdefaults__.pop("initial_backoff")
    other = inflatable_utils.pull_and_inflate_object_from_tree.__kwdefaults__
    before = dict(other)
    with pytest.raises(RuntimeError, match=r"pull_objects has no keyword defaults "
                                           r"\['initial_backoff'\].*flower_patches\.py"):
        P.shorten_object_pulls(first_retry=0.01, longest=0.01)
    assert other == before  # nothing patched half-way


def test_a_supernode_loop_without_time_is_named(restore_flower, monkeypatch):
    monkeypatch.setattr(start_client_internal, "time", object())
    before = dict(inflatable_utils.pull_objects.__kwdefaults__)
    with pytest.raises(RuntimeError, match="start_client_internal no longer imports time"):
        P.shorten_supernode_waits()
    assert inflatable_utils.pull_objects.__kwdefaults__ == before


def test_a_superexec_loop_without_get_executor_is_named(restore_flower, monkeypatch):
    monkeypatch.delattr(run_superexec, "get_executor")
    with pytest.raises(RuntimeError, match="run_superexec no longer builds its executor"):
        P.use_superexec_executor(SubprocessExecutor())


# ------------------------------------------------------------------ what each patch does
def test_object_pulls_retry_after_50_ms_up_to_200_ms_within_flowers_time_limit(restore_flower):
    P.shorten_object_pulls()
    for fn in P.pull_functions():
        d = fn.__kwdefaults__
        assert (d["initial_backoff"], d["backoff_cap"], d["max_tries_per_object"]) == (
            0.05, 0.2, None)
        assert d["max_time"] == 7200  # Flower's limit, unchanged


def test_a_missing_object_is_pulled_again_quickly(restore_flower):
    """Flower's own pull_objects, with an object that appears after 0.3 s."""
    P.shorten_object_pulls()
    start = time.monotonic()

    def pull(object_id: str) -> bytes:
        if time.monotonic() - start < 0.3:
            raise inflatable_utils.ObjectUnavailableError(object_id)
        return b"content"

    assert inflatable_utils.pull_objects(["a"], pull) == {"a": b"content"}
    assert time.monotonic() - start < 0.8  # Flower's 1 s first retry would take >= 0.8 s


def test_supernode_sleeps_map_flowers_literals(restore_flower, monkeypatch):
    slept = []
    monkeypatch.setattr(P.time, "sleep", slept.append)
    P.shorten_supernode_waits(idle=0.25, reply=0.05)
    clock = start_client_internal.time
    clock.sleep(3)
    clock.sleep(0.5)
    clock.sleep(7)
    assert slept == [0.25, 0.05, 7]
    assert clock.time() > 0 and clock.monotonic() > 0  # everything else: the time module
    assert inflatable_utils.pull_objects.__kwdefaults__["initial_backoff"] == 0.05


def test_the_superexec_loop_gets_the_executor_given(restore_flower):
    executor = SubprocessExecutor()
    P.use_superexec_executor(executor)
    assert run_superexec.get_executor(ExecutorType.SUBPROCESS, None, insecure=True) is executor


def test_an_object_that_is_no_executor_is_refused_naming_what_it_lacks(restore_flower):
    class LaunchOnly:
        def launch(self, spec):
            return None

    flowers = run_superexec.get_executor
    with pytest.raises(TypeError, match=r"lacks \['close', 'get_eligible_capacity', "
                                        r"'reconcile', 'wait_for_capacity'\]"):
        P.use_superexec_executor(LaunchOnly())
    assert run_superexec.get_executor is flowers


@pytest.mark.parametrize("kwargs", [dict(idle=0), dict(idle=61), dict(reply=-1)])
def test_bad_waits_are_refused(kwargs, restore_flower):
    before = start_client_internal.time
    with pytest.raises(ValueError, match="seconds"):
        P.shorten_supernode_waits(**kwargs)
    assert start_client_internal.time is before


def test_bad_object_pull_waits_are_refused(restore_flower):
    with pytest.raises(ValueError, match="first_retry"):
        P.shorten_object_pulls(first_retry=1, longest=0.5)


def test_idle_pull_from_the_environment():
    assert idle_pull_seconds({}) == P.SUPERNODE_IDLE_PULL
    assert idle_pull_seconds({IDLE_PULL_ENV: "1.5"}) == 1.5
    for bad in ("0", "abc", "100"):
        with pytest.raises(SystemExit, match=f"{IDLE_PULL_ENV}='{bad}'.*seconds in"):
            idle_pull_seconds({IDLE_PULL_ENV: bad})


def test_the_pruned_fab_walk_builds_flowers_fab_byte_for_byte(tmp_path):
    """A project with a venv, build/ and __pycache__/ folders (and a nested .venv, which
    Flower's top-anchored '.venv/**' keeps): the patched walk gives the same FAB bytes as
    Flower's own, without entering the pruned folders."""
    from flwr.cli import build  # noqa: PLC0415

    (tmp_path / "pyproject.toml").write_text(PYPROJECT)  # a user project's
    for name in (".venv/lib/site.py", ".venv/x.json", "build/b.py", "__pycache__/c.py",
                 "pkg/__pycache__/d.py", "pkg/mod.py", "pkg/nested/.venv/kept.py",
                 "lib/e.py", "README.md", "notes.txt", ".git/hooks/h.py"):
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {name}\n")
    walked = P.collect_files_pruned(tmp_path)
    assert ".venv/lib/site.py" not in walked and "pkg/__pycache__/d.py" not in walked
    assert "pkg/nested/.venv/kept.py" in walked and ".git/hooks/h.py" in walked
    flowers = build.build_fab_from_disk(tmp_path)
    original = build.collect_files
    try:
        P.prune_fab_walk()
        assert build.build_fab_from_disk(tmp_path) == flowers
    finally:
        build.collect_files = original


def test_an_idle_superexec_polls_every_half_second_a_busy_one_at_its_own_interval(monkeypatch):
    slept, now = [], [100.0]
    monkeypatch.setattr(P, "time", SimpleNamespace(monotonic=lambda: now[0],
                                                   sleep=slept.append))
    busy = [99.0]
    sleeper = P.IdleSleep(lambda: busy[0], idle=0.5, hot=30.0)
    sleeper.sleep(0.1)  # a ClientApp 1 s ago: Flower's own interval
    busy[0] = 60.0
    sleeper.sleep(0.1)  # nothing for 40 s: the idle interval
    sleeper.sleep(2.0)  # a longer interval of its own stays
    assert slept == [0.1, 0.5, 2.0]
    assert sleeper.monotonic() == 100.0  # every other attribute is the time module's
    original = run_superexec.time
    try:
        P.slow_idle_superexec_polls(lambda: 0.0)
        assert isinstance(run_superexec.time, P.IdleSleep)
        P.slow_idle_superexec_polls(lambda: 0.0)  # asked for twice: still one IdleSleep
    finally:
        run_superexec.time = original
    with pytest.raises(ValueError, match="idle"):
        P.slow_idle_superexec_polls(lambda: 0.0, idle=0)
