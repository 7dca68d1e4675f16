"""The simulated clock's pure math (strategies.engine.clock, strategies.engine.devices) against hand-computed
numbers: eq. (1), the deadline cut-off, sync events, byte budgets, availability, fleets, traces."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from strategies.engine import clock as ck
from strategies.engine import devices as dv
from strategies.engine.devices import DeviceProfile

# 8 Mbit/s = 10^6 bytes/s; 4 Mbit/s = 0.5 * 10^6 bytes/s
SLOW = DeviceProfile(speed=0.5, downlink_mbps=8.0, uplink_mbps=4.0)


# ---------------------------------------------------------------- eq. (1)
def test_transfer_seconds_megabits():
    assert ck.bytes_per_second(8.0) == 1e6
    assert ck.transfer_seconds(2e6, 8.0) == pytest.approx(2.0)
    assert ck.transfer_seconds(1e6, 4.0) == pytest.approx(2.0)


def test_client_seconds_is_download_compute_upload():
    # down 1e6 B / 1e6 B/s = 1 s; compute 10 steps * 32 examples * 1 ms / 0.5 = 0.64 s;
    # up 1e6 B / 0.5e6 B/s = 2 s
    assert ck.step_seconds(SLOW, 32, 1e-3) == pytest.approx(0.064)
    assert ck.client_seconds(SLOW, 10, 32, 1e-3, 1e6, 1e6) == pytest.approx(3.64)
    assert ck.client_seconds(DeviceProfile(), 0, 32, 1e-3, 0, 0) == 0.0


@pytest.mark.parametrize("deadline, steps", [
    (3.64, 10),   # exactly the full work
    (3.70, 10),   # spare 0.70 s / 0.064 s = 10.9
    (3.63, 9),    # spare 0.63 / 0.064 = 9.84
    (3.064, 1),   # one step exactly
    (3.06, 0),    # transfers fit, not one step
    (3.0, 0),     # only the transfers
    (2.5, 0),     # not even the transfers
])
def test_steps_within_the_deadline(deadline, steps):
    assert ck.steps_within(deadline, SLOW, 32, 1e-3, 1e6, 1e6) == steps


def test_extra_examples_are_compute_outside_the_steps():
    # 100 more examples at 1 ms / 0.5 = 0.2 s: 3.64 + 0.2; the deadline fits 3 steps fewer
    assert ck.client_seconds(SLOW, 10, 32, 1e-3, 1e6, 1e6, extra_examples=100) == \
        pytest.approx(3.84)
    assert ck.steps_within(3.64, SLOW, 32, 1e-3, 1e6, 1e6, extra_examples=100) == 6
    assert ck.steps_within(3.1, SLOW, 32, 1e-3, 1e6, 1e6, extra_examples=100) == 0


def test_round_seconds_last_reply_or_deadline():
    assert ck.round_seconds([1.0, 3.0, 2.0]) == 3.0
    assert ck.round_seconds([1.0, 3.0], deadline=5.0) == 3.0  # nobody dropped: last reply
    assert ck.round_seconds([1.0, 3.0], deadline=5.0, waited_for_deadline=True) == 5.0
    assert ck.round_seconds([], deadline=5.0, waited_for_deadline=True) == 5.0
    assert ck.round_seconds([]) == 0.0


def test_sync_event_times_hand_computed():
    # L = 2: A syncs every step (chunks of 1), B once (a chunk of 2).
    # A: model at 0.5, step 1 s, upload 0.5 -> event 1 at 2.0; model back at 2.5,
    # step, upload -> 4.0. B: model at 1, 2 steps of 2 s, upload 1 -> 6.0. Event 2 = 6.0.
    events = [[("A", 1)], [("A", 1), ("B", 2)]]
    times = ck.sync_event_times(events, {"A": 1.0, "B": 2.0}, {"A": 0.5, "B": 1.0},
                                {"A": 0.5, "B": 1.0}, start=0.0)
    assert times == pytest.approx([2.0, 6.0])
    # a slow high-frequency client delays its group's every event
    times = ck.sync_event_times(events, {"A": 3.0, "B": 0.5}, {"A": 0.5, "B": 0.5},
                                {"A": 0.5, "B": 0.5}, start=10.0)
    # A: 10.5 + 3 + 0.5 = 14; back 14.5 + 3 + 0.5 = 18; B: 10.5 + 1 + 0.5 = 12 -> 18
    assert times == pytest.approx([14.0, 18.0])


def test_one_sync_event_is_eq_1():
    fast, slow = DeviceProfile(speed=2.0), SLOW
    c, b, size = 2e-3, 16, 3e5
    events = [[(0, 7), (1, 5)]]
    step = {0: ck.step_seconds(fast, b, c), 1: ck.step_seconds(slow, b, c)}
    down = {0: ck.transfer_seconds(size, fast.downlink_mbps),
            1: ck.transfer_seconds(size, slow.downlink_mbps)}
    up = {0: ck.transfer_seconds(size, fast.uplink_mbps),
          1: ck.transfer_seconds(size, slow.uplink_mbps)}
    (t,) = ck.sync_event_times(events, step, down, up)
    assert t == pytest.approx(max(ck.client_seconds(fast, 7, b, c, size, size),
                                  ck.client_seconds(slow, 5, b, c, size, size)))


def test_byte_budget_is_seconds_times_harmonic_mean_bandwidth():
    # 8 Mbit/s both ways = 1e6 B/s: 10 s move 1e7 bytes
    assert ck.byte_budget(DeviceProfile(downlink_mbps=8, uplink_mbps=8), 10) == pytest.approx(1e7)
    # 2e6 and 0.5e6 B/s: 2 / (0.5e-6 + 2e-6) = 0.8e6 B/s
    assert ck.byte_budget(DeviceProfile(downlink_mbps=16, uplink_mbps=4), 10) == pytest.approx(8e6)


# ---------------------------------------------------------------- the timer
def test_round_timer_accumulates_and_cuts_by_the_deadline():
    fleet = dv.TraceFleet({0: SLOW, 1: DeviceProfile(speed=1.0, downlink_mbps=8, uplink_mbps=8)})
    timer = ck.RoundTimer(ck.SimClock(fleet, seconds_per_example=1e-3), seed=0, deadline=3.63)
    assert timer.start_round(1, [0, 1]) == [True, True] and timer.wait == 0.0
    assert timer.steps_by_deadline(0, 32, 1e6, 1e6) == 9
    assert timer.client_seconds(1, 10, 32, 1e6, 1e6) == pytest.approx(2.32)  # 1 + 0.32 + 1
    assert timer.finish_round([2.32, 3.0]) == pytest.approx(3.0)
    assert timer.finish_round([2.0], waited_for_deadline=True) == pytest.approx(3.63)
    assert timer.elapsed == pytest.approx(6.63)
    no_deadline = ck.RoundTimer(ck.SimClock(fleet, 1e-3), seed=0)
    assert no_deadline.steps_by_deadline(0, 32, 1e6, 1e6) is None


def test_round_timer_waits_for_a_window():
    night = DeviceProfile(windows=((3600.0, 7200.0),))
    timer = ck.RoundTimer(ck.SimClock(dv.TraceFleet({0: night}), 1e-3), seed=0)
    assert timer.start_round(1, [0]) == [True]
    assert timer.wait == 3600.0
    assert timer.finish_round([10.0]) == 3610.0 and timer.elapsed == 3610.0


def test_round_timer_online_nodes_and_m_of_all_nodes():
    # node 10 holds partition 0 (always on), node 11 partition 1 (window closed at t = 0)
    closed = DeviceProfile(windows=((10.0, 20.0),))
    fleet = dv.TraceFleet({0: DeviceProfile(), 1: closed, 2: DeviceProfile()})
    timer = ck.RoundTimer(ck.SimClock(fleet, 1e-3), seed=0)
    # m = max(floor(0.5 * 3), 1) = 1 of the 3 nodes, at most the 2 online ones
    assert timer.online_nodes(1, [10, 11, 12], [0, 1, 2], 0.5) == ([10, 12], 1)
    # m = floor(1.0 * 3) = 3, capped at the 2 online
    assert timer.online_nodes(2, [10, 11, 12], [0, 1, 2], 1.0) == ([10, 12], 2)


def test_clock_partition_id_names_the_query_helper():
    from strategies.engine.records import QUERY_HELPER, ClientInfo, clock_partition_id  # noqa: PLC0415

    clients = {7: ClientInfo(partition_id=3), 8: ClientInfo()}
    assert clock_partition_id("FedAvg", clients, 7) == 3
    for node in (8, 9):  # a node that reported no partition id, and one never seen
        with pytest.raises(ValueError, match=f"FedAvg: node {node} reported no .*{QUERY_HELPER}"):
            clock_partition_id("FedAvg", clients, node)


def test_uncalibrated_clock_says_how_to_calibrate():
    timer = ck.RoundTimer(ck.SimClock(dv.TraceFleet({0: SLOW})), seed=0)
    with pytest.raises(ValueError, match="seconds_per_example"):
        timer.client_seconds(0, 1, 1, 0, 0)
    timer.calibrate(1e-3)
    assert timer.client_seconds(0, 1, 1, 0, 0) == pytest.approx(2e-3)


@pytest.mark.parametrize("deadline", [0.0, -1.0, float("inf"), float("nan"), True])
def test_round_timer_rejects_bad_deadlines(deadline):
    with pytest.raises(ValueError, match="deadline"):
        ck.RoundTimer(ck.SimClock(dv.TraceFleet({0: SLOW})), seed=0, deadline=deadline)


@pytest.mark.parametrize("cost", [0.0, -1e-3, float("inf")])
def test_sim_clock_rejects_bad_costs(cost):
    with pytest.raises(ValueError, match="seconds_per_example"):
        ck.SimClock(dv.TraceFleet({0: SLOW}), cost)


# ---------------------------------------------------------------- availability
def test_windows_of_the_day():
    p = DeviceProfile(windows=((0.0, 100.0), (50000.0, 60000.0)))
    assert dv.in_window(p, 0.0) and dv.in_window(p, 99.9) and not dv.in_window(p, 100.0)
    assert dv.in_window(p, dv.DAY + 55000.0)
    assert dv.next_window_open(p, 200.0) == 50000.0
    assert dv.next_window_open(p, 70000.0) == dv.DAY  # tomorrow's first window
    assert dv.next_window_open(p, 55000.0) == 55000.0
    assert dv.wait_for_window([p, DeviceProfile(windows=((300.0, 400.0),))], 200.0) == 100.0
    assert dv.wait_for_window([p, DeviceProfile()], 200.0) == 0.0


def test_online_mask_draws_availability_per_round_and_partition():
    profiles = [DeviceProfile(availability=0.3)] * 2000
    pids = list(range(2000))
    mask = dv.online_mask(profiles, pids, seed=1, server_round=1, now=0.0)
    assert abs(np.mean(mask) - 0.3) < 0.04
    assert mask == dv.online_mask(profiles, pids, seed=1, server_round=1, now=0.0)
    assert mask != dv.online_mask(profiles, pids, seed=1, server_round=2, now=0.0)
    # a partition's draw does not depend on the others
    assert dv.online_mask(profiles[5:6], [5], seed=1, server_round=1, now=0.0) == [mask[5]]
    assert all(dv.online_mask([DeviceProfile()] * 3, [0, 1, 2], 1, 1, 0.0))
    closed = DeviceProfile(windows=((10.0, 20.0),))
    assert dv.online_mask([closed], [0], 1, 1, now=0.0) == [False]


# ---------------------------------------------------------------- fleets
def test_homogeneous_fleet():
    fleet = dv.GeneratedFleet("homogeneous", downlink_mbps=10, uplink_mbps=2, availability=0.9)
    assert set(fleet.profiles(range(5)).values()) == {DeviceProfile(1.0, 10, 2, 0.9)}


def test_lognormal_fleet_is_seeded_per_partition_around_the_reference():
    fleet = dv.GeneratedFleet("lognormal", seed=4, sigma=1.0)
    many = fleet.profiles(range(4000))
    speeds = np.array([p.speed for p in many.values()])
    downs = np.array([p.downlink_mbps for p in many.values()])
    assert abs(np.median(np.log(speeds))) < 0.08  # median 1 = the reference device
    assert abs(np.std(np.log(speeds)) - 1.0) < 0.05
    assert abs(np.median(downs) / 20.0 - 1) < 0.1
    assert dv.GeneratedFleet("lognormal", seed=4).profile(17) == many[17]  # K-independent
    assert dv.GeneratedFleet("lognormal", seed=5).profile(17) != many[17]
    flat = dv.GeneratedFleet("lognormal", seed=4, sigma=0.0).profile(3)
    assert flat == DeviceProfile(1.0, 20.0, 5.0)


def test_two_tier_fleet():
    fleet = dv.GeneratedFleet("two-tier", seed=2, rich_fraction=0.3, poor_factor=10.0)
    many = list(fleet.profiles(range(3000)).values())
    rich = [p for p in many if p.speed == 1.0]
    assert abs(len(rich) / len(many) - 0.3) < 0.03
    assert set(many) == {DeviceProfile(1.0, 20.0, 5.0), DeviceProfile(0.1, 2.0, 0.5)}


def test_tiers_fleet_is_one_speed_per_tier():
    fleet = dv.GeneratedFleet("tiers", seed=2, tiers=5)
    assert [fleet.profile(p).speed for p in range(7)] == [1, 0.5, 0.25, 0.125, 0.0625, 1, 0.5]
    assert fleet.profile(3) == DeviceProfile(0.125, 20.0, 5.0)
    assert dv.GeneratedFleet("tiers", tiers=1).profile(9).speed == 1.0


@pytest.mark.parametrize("kwargs, word", [
    ({"kind": "uniform"}, "not known"), ({"kind": "lognormal", "sigma": -0.1}, "sigma"),
    ({"kind": "tiers", "tiers": 0}, "tiers"), ({"kind": "tiers", "tiers": 2.5}, "tiers"),
    ({"kind": "two-tier", "rich_fraction": 1.5}, "rich_fraction"),
    ({"kind": "two-tier", "poor_factor": 0.5}, "poor_factor"),
    ({"kind": "homogeneous", "downlink_mbps": 0.0}, "downlink_mbps"),
    ({"kind": "homogeneous", "availability": 1.1}, "availability"),
])
def test_fleet_parameters_are_checked(kwargs, word):
    with pytest.raises(ValueError, match=word):
        dv.GeneratedFleet(**kwargs)


# ---------------------------------------------------------------- traces
def test_csv_trace_round_trip(tmp_path):
    devices = {0: SLOW, 3: DeviceProfile(2.0, 50.0, 10.0, 0.75, ((0.0, 3600.0), (7200.0, 9000.0)))}
    path = dv.write_trace(tmp_path / "t.csv", devices)
    assert path.read_text().splitlines()[0] == ",".join(dv.TRACE_COLUMNS)
    fleet = dv.load_trace(path)
    assert fleet.profiles([0, 3]) == devices
    with pytest.raises(ValueError, match="no row for partition-id 1"):
        fleet.profile(1)


def test_json_trace_with_defaults(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"devices": [
        {"partition-id": 0, "speed": 0.5, "downlink-mbps": 8, "uplink-mbps": 4},
        {"partition-id": 1, "speed": 1, "downlink-mbps": 8, "uplink-mbps": 8,
         "availability": 0.5, "windows": [[0, 3600]]}]}))
    fleet = dv.load_trace(path)
    assert fleet.profile(0) == SLOW
    assert fleet.profile(1) == DeviceProfile(1.0, 8.0, 8.0, 0.5, ((0.0, 3600.0),))


@pytest.mark.parametrize("text, word", [
    ("partition-id,speed,downlink-mbps,uplink-mbps\n0,1,1,1\n0,1,1,1\n", "listed twice"),
    ("partition-id,speed,downlink-mbps,uplink-mbps\n0,0,1,1\n", "speed"),
    ("partition-id,speed,downlink-mbps\n0,1,1\n", "uplink-mbps"),
    ("partition-id,speed,downlink-mbps,uplink-mbps,windows\n0,1,1,1,5-2\n", "window"),
    ("partition-id,speed,downlink-mbps,uplink-mbps\n", "no device"),
])
def test_bad_traces_name_the_problem(tmp_path, text, word):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=word):
        dv.load_trace(path)


def test_trace_path_must_be_a_csv_or_json_file(tmp_path):
    with pytest.raises(ValueError, match="not a file"):
        dv.load_trace(tmp_path / "missing.csv")
    (tmp_path / "t.txt").write_text("x")
    with pytest.raises(ValueError, match=r"\.csv or \.json"):
        dv.load_trace(tmp_path / "t.txt")


def test_the_shipped_example_traces_agree():
    folder = Path(__file__).resolve().parents[1] / "examples" / "device-traces"
    csv_fleet = dv.load_trace(folder / "fleet.csv")
    json_fleet = dv.load_trace(folder / "fleet.json")
    assert csv_fleet.profiles(range(4)) == json_fleet.profiles(range(4))
    assert csv_fleet.profile(2).windows == ((0.0, 28800.0), (64800.0, 86400.0))


def test_a_loss_query_costs_the_download_and_a_third_of_a_trained_example_per_example():
    """Power-of-Choice's query on the clock: 10^6 bytes at 8 Mbit/s = 1 s, plus 300 examples
    x 0.01 s / 3 at speed 2 = 0.5 s (the loss sent back is a few bytes: not counted)."""
    from strategies.engine.clock import evaluation_seconds

    profile = DeviceProfile(speed=2.0, downlink_mbps=8.0, uplink_mbps=1.0)
    assert evaluation_seconds(profile, 300, 0.01, 1e6) == pytest.approx(1.5)
