"""fedapp.flower_pulls, deploy.flower_waits, deploy.supernode: Flower 1.41's fixed waits,
shortened in the processes we start, and a loud failure when a Flower upgrade moves them. The
deployed runs in tests/test_deploy_e2e.py and tests/test_deploy_faults.py go through them end
to end."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("flwr")

from flwr.supercore.inflatable import inflatable_utils  # noqa: E402
from flwr.supernode import start_client_internal  # noqa: E402

from deploy import flower_waits  # noqa: E402
from deploy.supernode import IDLE_PULL_ENV, idle_pull_seconds  # noqa: E402
from fedapp import flower_pulls  # noqa: E402


@pytest.fixture
def restore_flower(monkeypatch):
    """Put Flower's defaults and its time module back after the test."""
    for fn in flower_pulls.PULL_FUNCTIONS:
        monkeypatch.setattr(fn, "__kwdefaults__", dict(fn.__kwdefaults__))
    monkeypatch.setattr(start_client_internal, "time", start_client_internal.time)


def test_this_flower_has_the_waits_we_shorten():
    flower_waits.check_flower_waits()
    assert inflatable_utils.PULL_INITIAL_BACKOFF == 1  # what the docs say Flower waits
    source = open(start_client_internal.__file__, encoding="utf-8").read()
    assert "time.sleep(3)" in source and "time.sleep(0.5)" in source


def test_object_pulls_retry_after_50_ms_up_to_200_ms_within_flowers_time_limit(restore_flower):
    flower_pulls.shorten_object_pulls()
    for fn in flower_pulls.PULL_FUNCTIONS:
        d = fn.__kwdefaults__
        assert (d["initial_backoff"], d["backoff_cap"], d["max_tries_per_object"]) == (
            0.05, 0.2, None)
        assert d["max_time"] == 7200  # Flower's limit, unchanged


def test_a_missing_object_is_pulled_again_quickly(restore_flower):
    """Flower's own pull_objects, with an object that appears after 0.3 s."""
    flower_pulls.shorten_object_pulls()
    start = time.monotonic()

    def pull(object_id: str) -> bytes:
        if time.monotonic() - start < 0.3:
            raise inflatable_utils.ObjectUnavailableError(object_id)
        return b"content"

    assert inflatable_utils.pull_objects(["a"], pull) == {"a": b"content"}
    assert time.monotonic() - start < 0.8  # Flower's 1 s first retry would take >= 0.8 s


def test_supernode_sleeps_map_flowers_literals(restore_flower, monkeypatch):
    slept = []
    monkeypatch.setattr(flower_waits._time, "sleep", slept.append)
    flower_waits.shorten_supernode_waits(idle=0.25, reply=0.05)
    clock = start_client_internal.time
    clock.sleep(3)
    clock.sleep(0.5)
    clock.sleep(7)
    assert slept == [0.25, 0.05, 7]
    assert clock.time() > 0 and clock.monotonic() > 0  # everything else: the time module
    assert inflatable_utils.pull_objects.__kwdefaults__["initial_backoff"] == 0.05


@pytest.mark.parametrize("kwargs", [dict(idle=0), dict(idle=61), dict(reply=-1)])
def test_bad_waits_are_refused(kwargs, restore_flower):
    with pytest.raises(ValueError, match="seconds"):
        flower_waits.shorten_supernode_waits(**kwargs)


def test_bad_object_pull_waits_are_refused(restore_flower):
    with pytest.raises(ValueError, match="first_retry"):
        flower_pulls.shorten_object_pulls(first_retry=1, longest=0.5)


def test_idle_pull_from_the_environment():
    assert idle_pull_seconds({}) == flower_waits.SUPERNODE_IDLE_PULL
    assert idle_pull_seconds({IDLE_PULL_ENV: "1.5"}) == 1.5
    for bad in ("0", "abc", "100"):
        with pytest.raises(SystemExit, match=f"{IDLE_PULL_ENV}='{bad}'.*seconds in"):
            idle_pull_seconds({IDLE_PULL_ENV: bad})
