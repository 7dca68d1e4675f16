"""Flower 1.41's retry wait for a message's arrays, shortened in the processes that pull.

``flwr/supercore/inflatable/inflatable_utils.py``: ``pull_objects`` and
``pull_and_inflate_object_from_tree`` pull a message's arrays (the ServerApp from the
SuperLink, a SuperNode from the SuperLink, a ClientApp from its SuperNode). An object that
is not there yet is asked for again after 1 s, then 2, 4, ... (cap 10 s; at most 500 tries
or 7,200 s). A message is stored before its arrays, so a puller that asks at once waits
the first second, often three (profiled in docs/deployment.md, "Why a deployed round costs
more"). Here: first retry after 0.05 s, doubling up to 0.2 s; the 7,200 s limit kept, the
try limit dropped (500 short tries would end the wait far sooner).

Neither function has an argument or environment variable for it; their keyword defaults
are replaced. :func:`check_object_pulls` fails loudly when a Flower upgrade moves them
(``tests/test_flower_waits.py``). The ServerApp's Grid (:mod:`fedapp.grid`) and the
deployment's SuperNodes and SuperExecs (:mod:`deploy.flower_waits`) call it; this module
imports only flwr, so a SuperExec that runs any app can use it.
"""

from __future__ import annotations

from flwr.supercore.inflatable import inflatable_utils

OBJECT_PULL_FIRST_RETRY = 0.05  # seconds; Flower: PULL_INITIAL_BACKOFF = 1
OBJECT_PULL_LONGEST_WAIT = 0.2  # seconds; Flower: PULL_BACKOFF_CAP = 10
PULL_KEYWORDS = {"initial_backoff", "backoff_cap", "max_tries_per_object", "max_time"}
PULL_FUNCTIONS = (inflatable_utils.pull_objects,
                  inflatable_utils.pull_and_inflate_object_from_tree)


def check_object_pulls() -> None:
    """Raise if this Flower's pull functions no longer have the keyword defaults we set."""
    for fn in PULL_FUNCTIONS:
        missing = PULL_KEYWORDS - set(fn.__kwdefaults__ or {})
        if missing:
            raise RuntimeError(f"flwr changed: {fn.__module__}.{fn.__name__} has no keyword "
                               f"defaults {sorted(missing)}; update fedapp/flower_pulls.py")


def shorten_object_pulls(first_retry: float = OBJECT_PULL_FIRST_RETRY,
                         longest: float = OBJECT_PULL_LONGEST_WAIT) -> None:
    """In this process: a missing object is asked for again after ``first_retry`` s, then
    doubling up to ``longest`` s; it fails after Flower's ``max_time`` (7,200 s) as before."""
    if not 0 < first_retry <= longest:
        raise ValueError(f"first_retry={first_retry!r}, longest={longest!r}: need "
                         "0 < first_retry <= longest seconds")
    check_object_pulls()
    for fn in PULL_FUNCTIONS:
        fn.__kwdefaults__.update(initial_backoff=first_retry, backoff_cap=longest,
                                 max_tries_per_object=None)
