"""Every patch of Flower internals fedhetero makes, in one opt-in module (flwr only).

Nothing is patched on import: a process asks for each patch by calling its function, and
each function first checks that this Flower still has what it replaces (a clear
``RuntimeError`` naming the Flower function and this file otherwise).
``tests/test_flower_patches.py`` pins the Flower version (:data:`FLOWER_VERSION`) and the
signatures and literals the patches were written for, and fails on any other version.
Profiles and figures: docs/deployment.md, "Why a deployed round costs more".

* :func:`shorten_object_pulls` (the ServerApp, ``deploy.supernode``,
  ``deploy.warm_superexec``): ``flwr/supercore/inflatable/inflatable_utils.py``'s
  ``pull_objects`` and ``pull_and_inflate_object_from_tree`` pull a message's arrays and ask
  again for one not yet there after 1 s, 2, 4, ... (cap 10 s; at most 500 tries or 7,200 s).
  A message is stored before its arrays, so a puller that asks at once waits the first
  second, often three. Patched: their keyword defaults (``__kwdefaults__``; neither has an
  argument or environment variable for it): first retry after 0.05 s, doubling up to
  0.2 s, the 7,200 s limit kept, the try limit dropped (500 short tries would end the wait
  far sooner).
* :func:`shorten_supernode_waits` (``deploy.supernode``):
  ``flwr/supernode/start_client_internal.py``, the SuperNode's loop, sleeps
  ``time.sleep(3)`` after a pull that brought no message and ``time.sleep(0.5)`` between
  checks for a ClientApp's reply. Patched: the ``time`` module that loop sleeps with, by a
  :class:`SleepMap` (0.5 s and 0.05 s by default), plus :func:`shorten_object_pulls`.
* :func:`prune_fab_walk` (``simulation.runtime.flwr_command``, the ``flwr`` CLI that
  ``flwr run`` goes through): ``flwr/cli/build.py``'s ``collect_files`` walks every file
  under the app's folder (``os.walk``, a ``resolve()`` each) before the FAB's patterns
  drop most of them; with the venv inside the project (``make install``'s ``.venv``) that
  is 72,000 files and about 12 s of CPU per ``flwr run`` on a 2-core machine. Patched: the
  same walk, not entering the folders that Flower's own non-overridable
  ``FAB_EXCLUDE_PATTERNS`` exclude whole (``.venv/``, ``build/``, ... at the top,
  ``__pycache__/`` anywhere): the same FAB, byte for byte.
* :func:`slow_idle_superexec_polls` (``deploy.warm_superexec``): the same loop sleeps
  ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` (0.1 s in ``deploy run``) between two polls, each a
  request its SuperNode serves, also while no ClientApp has run for minutes (an idle
  4-SuperNode deployment: 0.04 of a core per SuperNode, 0.02 per SuperExec). Patched: the
  ``time`` module that loop sleeps with, by an :class:`IdleSleep`: at least 0.5 s between
  polls once nothing has run for 30 s; the first message after that waits at most 0.5 s.
* :func:`use_superexec_executor` (``deploy.warm_superexec``):
  ``flwr/supercore/superexec/run_superexec.py`` builds its executor with ``get_executor``
  by type name; patched: that name, so the loop runs the executor given.
"""

from __future__ import annotations

import os
import re
import time
import types
from collections.abc import Callable
from pathlib import Path

FLOWER_VERSION = "1.42.0"  # the Flower these patches were checked against (the tests pin it)

OBJECT_PULL_FIRST_RETRY = 0.05  # seconds; Flower: PULL_INITIAL_BACKOFF = 1
OBJECT_PULL_LONGEST_WAIT = 0.2  # seconds; Flower: PULL_BACKOFF_CAP = 10
PULL_KEYWORDS = frozenset({"initial_backoff", "backoff_cap", "max_tries_per_object", "max_time"})

SUPERNODE_IDLE_PULL = 0.5  # seconds; Flower: 3
SUPERNODE_REPLY_CHECK = 0.05  # seconds; Flower: 0.5
FLOWER_IDLE_SLEEP, FLOWER_REPLY_SLEEP = 3, 0.5  # the literals in start_client_internal.py
SUPEREXEC_IDLE_POLL = 0.5  # seconds between a SuperExec's polls once it has been idle ...
SUPEREXEC_HOT = 30.0  # ... this many seconds (its own interval before)


def flower_changed(where: str, what: str) -> RuntimeError:
    """The error every check raises: which Flower function changed, and what to do."""
    return RuntimeError(f"flwr changed: {where} {what}; re-read it and update "
                        f"flower_patches.py (written for flwr {FLOWER_VERSION})")


# ------------------------------------------------------------------ a message's arrays
def pull_functions() -> tuple[Callable, ...]:
    """Flower's two functions that pull a message's arrays (their keyword defaults are
    what :func:`shorten_object_pulls` replaces)."""
    from flwr.supercore.inflatable import inflatable_utils  # noqa: PLC0415

    return inflatable_utils.pull_objects, inflatable_utils.pull_and_inflate_object_from_tree


def check_object_pulls() -> None:
    """Raise unless this Flower's pull functions have the keyword defaults we replace."""
    for fn in pull_functions():
        missing = PULL_KEYWORDS - set(fn.__kwdefaults__ or {})
        if missing:
            raise flower_changed(f"{fn.__module__}.{fn.__name__}",
                                 f"has no keyword defaults {sorted(missing)}")


def shorten_object_pulls(first_retry: float = OBJECT_PULL_FIRST_RETRY,
                         longest: float = OBJECT_PULL_LONGEST_WAIT) -> None:
    """In this process: a missing object is asked for again after ``first_retry`` s, then
    doubling up to ``longest`` s; it fails after Flower's ``max_time`` (7,200 s) as before."""
    if not 0 < first_retry <= longest:
        raise ValueError(f"first_retry={first_retry!r}, longest={longest!r}: need "
                         "0 < first_retry <= longest seconds")
    check_object_pulls()
    for fn in pull_functions():
        fn.__kwdefaults__.update(initial_backoff=first_retry, backoff_cap=longest,
                                 max_tries_per_object=None)


# ------------------------------------------------------------------ the SuperNode's loop
class SleepMap:
    """The ``time`` module, but ``sleep(s)`` sleeps ``waits.get(s, s)``."""

    def __init__(self, waits: dict[float, float]) -> None:
        self.waits = dict(waits)

    def sleep(self, seconds: float) -> None:
        time.sleep(self.waits.get(seconds, seconds))

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)


def check_supernode_waits() -> None:
    """Raise unless this Flower's SuperNode loop still sleeps with a ``time`` module we can
    replace (and its arrays' pulls as :func:`check_object_pulls`)."""
    from flwr.supernode import start_client_internal  # noqa: PLC0415

    check_object_pulls()
    if not isinstance(getattr(start_client_internal, "time", None), types.ModuleType | SleepMap):
        raise flower_changed("flwr.supernode.start_client_internal", "no longer imports time")


def shorten_supernode_waits(idle: float = SUPERNODE_IDLE_PULL,
                            reply: float = SUPERNODE_REPLY_CHECK) -> None:
    """In this (SuperNode) process: pull again ``idle`` s after an empty pull, check for a
    ClientApp's reply every ``reply`` s; object pulls as :func:`shorten_object_pulls`."""
    from flwr.supernode import start_client_internal  # noqa: PLC0415

    for name, value in (("idle", idle), ("reply", reply)):
        if not 0 < value <= 60:
            raise ValueError(f"{name}={value!r} must be in (0, 60] seconds")
    check_supernode_waits()
    shorten_object_pulls()
    start_client_internal.time = SleepMap({FLOWER_IDLE_SLEEP: idle, FLOWER_REPLY_SLEEP: reply})


# ------------------------------------------------------------------ the SuperExec's executor
def check_superexec_executor() -> None:
    """Raise unless Flower's SuperExec loop still builds its executor by ``get_executor``."""
    from flwr.supercore.superexec import run_superexec  # noqa: PLC0415

    if not callable(getattr(run_superexec, "get_executor", None)):
        raise flower_changed("flwr.supercore.superexec.run_superexec",
                             "no longer builds its executor with get_executor")


class IdleSleep:
    """The ``time`` module, but ``sleep(s)`` sleeps at least ``idle`` s once ``busy_at()``
    (a ``time.monotonic()`` reading) is more than ``hot`` s ago."""

    def __init__(self, busy_at: Callable[[], float], idle: float, hot: float) -> None:
        self.busy_at, self.idle, self.hot = busy_at, float(idle), float(hot)

    def sleep(self, seconds: float) -> None:
        if time.monotonic() - self.busy_at() > self.hot:
            seconds = max(seconds, self.idle)
        time.sleep(seconds)

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)


def slow_idle_superexec_polls(busy_at: Callable[[], float], idle: float = SUPEREXEC_IDLE_POLL,
                              hot: float = SUPEREXEC_HOT) -> None:
    """In this (SuperExec) process: Flower's loop polls at most every ``idle`` s while
    ``busy_at()`` is more than ``hot`` s ago, at its own interval otherwise."""
    from flwr.supercore.superexec import run_superexec  # noqa: PLC0415

    if not 0 < idle <= 60 or not hot >= 0:
        raise ValueError(f"idle={idle!r} must be in (0, 60] and hot={hot!r} >= 0 seconds")
    check_superexec_executor()
    if not isinstance(getattr(run_superexec, "time", None), types.ModuleType | IdleSleep):
        raise flower_changed("flwr.supercore.superexec.run_superexec", "no longer imports time")
    run_superexec.time = IdleSleep(busy_at, idle, hot)


def use_superexec_executor(executor: object) -> None:
    """In this process: Flower's ``run_superexec`` loop runs ``executor`` (an object with
    every method of Flower's ``Executor`` protocol) whatever executor type it is asked for."""
    from flwr.supercore.superexec import run_superexec  # noqa: PLC0415
    from flwr.supercore.superexec.executor.types import Executor  # noqa: PLC0415

    check_superexec_executor()
    protocol = sorted(name for name in vars(Executor) if not name.startswith("_"))
    missing = [name for name in protocol if not callable(getattr(executor, name, None))]
    if missing:
        raise TypeError(f"executor {executor!r} lacks {missing}: give an object with every "
                        f"method of Flower's Executor protocol {protocol}")
    run_superexec.get_executor = lambda *_args, **_kwargs: executor


# ------------------------------------------------------------------ the FAB's file walk
WHOLE_FOLDER = re.compile(r"(\*\*/)?([^*?\[\]/!]+)/\*\*")  # "X/**" (top) or "**/X/**" (any)


def fab_pruned_folders() -> tuple[frozenset[str], frozenset[str]]:
    """(top-level, any-depth) folder names that Flower's built-in ``FAB_EXCLUDE_PATTERNS``
    exclude with everything in them: no file under them can be in a FAB."""
    from flwr.cli import build  # noqa: PLC0415

    patterns = getattr(build, "FAB_EXCLUDE_PATTERNS", None)
    if not isinstance(patterns, tuple | list) or not callable(getattr(build, "collect_files",
                                                                     None)):
        raise flower_changed("flwr.cli.build", "has no FAB_EXCLUDE_PATTERNS or collect_files")
    top, anywhere = set(), set()
    for pattern in patterns:
        match = WHOLE_FOLDER.fullmatch(pattern)
        if match:
            (anywhere if match.group(1) else top).add(match.group(2))
    if ".venv" not in top or "__pycache__" not in anywhere:
        raise flower_changed("flwr.cli.build.FAB_EXCLUDE_PATTERNS",
                             "no longer excludes .venv/** and **/__pycache__/**")
    return frozenset(top), frozenset(anywhere)


def collect_files_pruned(root: Path) -> dict[str, Path]:
    """Flower's ``collect_files`` (relative POSIX path -> path of every regular file under
    ``root``, no symlinks, nothing resolving outside ``root``) without entering the
    folders of :func:`fab_pruned_folders`."""
    top, anywhere = fab_pruned_folders()
    resolved_root = root.resolve()
    files: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        at_top = Path(dirpath) == root
        dirnames[:] = [d for d in dirnames
                       if d not in anywhere and not (at_top and d in top)]
        for filename in filenames:
            path = Path(dirpath) / filename
            if path.is_symlink() or not path.resolve().is_relative_to(resolved_root):
                continue
            files[path.relative_to(root).as_posix()] = path
    return files


def prune_fab_walk() -> None:
    """In this (``flwr`` CLI) process: a FAB is built from :func:`collect_files_pruned`."""
    from flwr.cli import build  # noqa: PLC0415

    fab_pruned_folders()  # raises if Flower changed
    build.collect_files = collect_files_pruned
