"""The ``flash`` fleet (strategies.engine.flash_fleet): its numbers recomputed from FLASH's raw
JSON here, its draws (phones by the population's mix, per-round speed noise and bandwidths,
size correlation), reproducibility, mid-round dropout on the round engine and in the app,
and the refusals of bad values and bad data files."""

from __future__ import annotations

import json
import math
import shutil
from collections import Counter

import numpy as np
import pytest

from fedapp.config import ConfigError
from fedapp.registry import check_run_config, device_clock
from strategies import DynamicFL, FedAvg, FedBuff, FlashFleet
from strategies import contract as C
from strategies.engine import flash_fleet
from strategies.engine.async_tasks import AsyncTasks
from strategies.engine.clock import RoundTimer, SimClock, client_seconds
from strategies.engine.devices import DROPOUT_TAG, GeneratedFleet
from strategies.engine.flash_fleet import (FLASH_DATA, FLASH_ROUND_TAG, bandwidth_draw,
                                           load_population)
from tests.test_clock_strategy import (B, C_EX, FLEET, KW, SIZE, STEPS, T, _task_identity,
                                       run)

__all__ = ["_task_identity"]  # the strategies' runs need Flower's task identity (autouse)

RAW = {name: json.loads((FLASH_DATA / f"{name}.json").read_text())
       for name in ("real2benchmark", "benchmark2score", "speed_distri")}


def raw_mix() -> list[tuple[str, float]]:
    """(model, score) of every mapped device string, straight from the raw files."""
    scores = {name.lower(): score for name, score in RAW["benchmark2score"].items()}
    return [(model, float(scores[model.lower()]))
            for model in RAW["real2benchmark"].values() if model != "unknown"]


# ----------------------------------------------------------------- the derived numbers
def test_the_documented_counts_come_from_the_raw_files():
    mix = raw_mix()
    assert len(RAW["real2benchmark"]) == 772 and len(mix) == 162
    assert len({m for m, _ in mix}) == 115
    scores = [s for _, s in mix]
    assert (min(scores), float(np.median(scores)), max(scores)) == (511.0, 3686.0, 31725.0)
    users = RAW["speed_distri"].values()
    down, up = [u["down_u"] for u in users], [u["up_u"] for u in users]
    assert len(down) == 19
    assert (round(min(down)), round(max(down)), round(min(up)), round(max(up))) == (
        2370, 17333, 431, 6635)
    pop = load_population()
    assert (pop.reference, pop.unknown, len(pop.devices), len(pop.users)) == (3686.0, 610, 162, 19)


def test_the_packaged_licence_and_source_note_travel_with_the_data():
    licence = (FLASH_DATA / "LICENSE.md").read_text()
    assert licence.startswith("BSD 2-Clause License")
    note = (FLASH_DATA / "README.md").read_text()
    assert "PKU-Chengxu/FLASH" in note and "55cbede" in note


def test_a_partitions_speed_is_its_models_score_over_the_median():
    fleet = FlashFleet(seed=3)
    scores = {name.lower(): s for name, s in RAW["benchmark2score"].items()}
    median = float(np.median([s for _, s in raw_mix()]))
    for pid in range(20):
        device, user = fleet.assignment(pid)
        model = RAW["real2benchmark"][fleet.population.devices[device]]
        profile = fleet.profile(pid)
        assert profile.speed == pytest.approx(scores[model.lower()] / median)
        uid = sorted(RAW["speed_distri"])[user]
        assert profile.downlink_mbps == pytest.approx(RAW["speed_distri"][uid]["down_u"] / 1000)
        assert profile.uplink_mbps == pytest.approx(RAW["speed_distri"][uid]["up_u"] / 1000)


def test_the_drawn_phones_follow_the_populations_mix():
    fleet = FlashFleet(seed=0)
    n = 4000
    drawn = Counter(fleet.population.models[fleet.assignment(p)[0]] for p in range(n))
    mix = Counter(m for m, _ in raw_mix())
    for model, count in mix.most_common(6):
        share = count / 162
        assert abs(drawn[model] / n - share) < 4 * math.sqrt(share * (1 - share) / n), model
    speeds = np.array([fleet.profile(p).speed for p in range(n)])
    assert abs(np.mean(speeds <= 1.0) - 0.5) < 0.04  # speed 1 is the mix's median phone
    users = Counter(fleet.assignment(p)[1] for p in range(n))
    assert len(users) == 19 and max(users.values()) < 2 * n / 19


# ----------------------------------------------------------------- per round
def test_bandwidth_varies_per_round_around_the_users_measured_mean():
    fleet = FlashFleet(seed=1)
    pid = 5
    _, user = fleet.assignment(pid)
    (down_m, down_s), (up_m, up_s) = fleet.population.down[user], fleet.population.up[user]
    rounds = [fleet.round_profile(pid, t) for t in range(1, 2001)]
    down = np.array([p.downlink_mbps for p in rounds]) * 1000
    up = np.array([p.uplink_mbps for p in rounds]) * 1000
    assert len(set(down)) == len(down) and (down > 0).all() and (up > 0).all()
    assert abs(down.mean() - down_m) < 4 * down_s / math.sqrt(len(down))
    assert abs(up.mean() - up_m) < 4 * up_s / math.sqrt(len(up))
    assert down.std() == pytest.approx(down_s, rel=0.25)


def test_the_round_draw_is_the_documented_one():
    fleet = FlashFleet(seed=2, speed_noise=0.3)
    device, user = fleet.assignment(7)
    z = np.random.default_rng([2, 4, 7, FLASH_ROUND_TAG]).standard_normal(3)
    got = fleet.round_profile(7, 4)
    assert got.speed == pytest.approx(fleet.population.speed(device) * math.exp(0.3 * z[0]))
    m, s = fleet.population.down[user]
    sigma = math.sqrt(math.log(1 + (s / m) ** 2))
    assert got.downlink_mbps * 1000 == pytest.approx(math.exp(math.log(m) - sigma**2 / 2
                                                              + sigma * z[1]))
    assert bandwidth_draw(2000.0, 0.0, 3.0) == 2000.0


def test_noise_zero_keeps_the_benchmark_speed_and_noise_spreads_it():
    still = FlashFleet(seed=4, speed_noise=0.0)
    assert {still.round_profile(0, t).speed for t in range(1, 50)} == {still.profile(0).speed}
    noisy = FlashFleet(seed=4, speed_noise=0.2)
    logs = np.log([noisy.round_profile(0, t).speed / noisy.profile(0).speed
                   for t in range(1, 1001)])
    assert abs(logs.mean()) < 4 * 0.2 / math.sqrt(1000) and logs.std() == pytest.approx(0.2,
                                                                                       rel=0.1)


def test_the_timer_uses_the_rounds_profile_and_selection_the_mean_one():
    clock = SimClock(FlashFleet(seed=0), seconds_per_example=0.01)
    timer = RoundTimer(clock, seed=0)
    timer.start_round(3, [0, 1])
    args = (0, 4, 10, 1e6, 1e6)
    assert timer.client_seconds(*args) == pytest.approx(
        client_seconds(clock.fleet.round_profile(0, 3), 4, 10, 0.01, 1e6, 1e6))
    assert timer.client_seconds(*args, expected=True) == pytest.approx(
        client_seconds(clock.fleet.profile(0), 4, 10, 0.01, 1e6, 1e6))


def test_the_other_fleets_do_not_vary_per_round():
    for fleet in (GeneratedFleet("lognormal", seed=1), FLEET):
        clock = SimClock(fleet)
        assert clock.round_profile(2, 7) is clock.profile(2)


# ----------------------------------------------------------------- correlation
def test_correlation_one_gives_the_largest_partitions_the_fastest_phones():
    sizes = {p: int(n) for p, n in enumerate(np.random.default_rng(9).permutation(60) + 10)}
    fleet = FlashFleet(seed=0, correlation=1.0).with_sizes(sizes)
    by_size = [fleet.profile(p).speed for p in sorted(sizes, key=sizes.get)]
    assert by_size == sorted(by_size) and by_size[-1] > 5 * by_size[0]
    half = FlashFleet(seed=0, correlation=0.5).with_sizes(sizes)
    ranks = np.argsort(np.argsort([half.profile(p).speed for p in sizes]))
    assert np.corrcoef(ranks, list(sizes.values()))[0, 1] > 0.2
    free = FlashFleet(seed=0).with_sizes(sizes)
    assert free.profiles(sizes) == FlashFleet(seed=0).profiles(sizes)


# ----------------------------------------------------------------- reproducibility
def test_the_same_seed_gives_the_same_fleet_and_a_partition_its_own_profile():
    a, b = FlashFleet(seed=11), FlashFleet(seed=11)
    assert a.profiles(range(30)) == b.profiles(range(30))
    assert [a.round_profile(p, 2) for p in range(30)] == [b.round_profile(p, 2) for p in range(30)]
    assert a.profiles(range(30)) != FlashFleet(seed=12).profiles(range(30))
    few, many = a.profiles(range(5)), a.profiles(range(500))
    assert all(many[p] == few[p] for p in few)  # not a function of the number of partitions


# ----------------------------------------------------------------- dropout
def test_dropout_p_drops_about_p_at_a_uniform_point():
    timer = RoundTimer(SimClock(FLEET, dropout=0.3), seed=5)
    points = []
    for t in range(1, 1001):
        timer.start_round(t, [0, 1, 2])
        points += [timer.dropout_point(p) for p in (0, 1, 2)]
    dropped = [f for f in points if f is not None]
    n = len(points)
    assert abs(len(dropped) / n - 0.3) < 4 * math.sqrt(0.3 * 0.7 / n)
    assert all(0 <= f < 1 for f in dropped) and abs(np.mean(dropped) - 0.5) < 0.05
    rng = np.random.default_rng([5, 1000, 2, DROPOUT_TAG])
    drops, fraction = rng.random(2)
    assert timer.dropout_point(2) == (fraction if drops < 0.3 else None)
    never = RoundTimer(SimClock(FLEET), seed=5)
    never.start_round(1, [0])
    assert never.dropout_point(0) is None


def test_a_dropped_clients_reply_is_discarded_and_counted_until_it_dropped():
    seed, p = 0, 0.5
    strategy = FedAvg(**KW, seed=seed, clock=SimClock(FLEET, C_EX, dropout=p))
    run(strategy, rounds=4)
    compute = {pid: STEPS * B * C_EX / FLEET.profile(pid).speed for pid in range(3)}
    seen = 0
    for t in range(1, 5):
        points = {}
        for pid in range(3):
            drops, fraction = np.random.default_rng([seed, t, pid, DROPOUT_TAG]).random(2)
            if drops < p:
                points[pid] = fraction
        diag = strategy.round_log(t)
        assert diag[C.LOG_CLIENTS_DROPPED_OUT] == len(points)
        assert diag[C.LOG_DROPPED_OUT] == [str(pid) for pid in sorted(points)]
        assert diag[C.LOG_CLIENTS_RECEIVED] == 3 - len(points)
        assert diag[C.LOG_CLIENTS_FAILED] == len(points)
        times = [(2 * T + compute[pid]) * points.get(pid, 1.0) for pid in range(3)]
        assert diag[C.LOG_SIM_SECONDS] == pytest.approx(max(times))
        seen += len(points)
    assert 0 < seen < 12  # the seed drops some clients, not all


def test_the_engine_times_the_flash_fleets_round_profiles_and_binds_sizes():
    fleet = FlashFleet(seed=0, speed_noise=0.2, correlation=1.0)
    strategy = FedAvg(**KW, clock=SimClock(fleet, C_EX))
    run(strategy, rounds=2)
    bound = strategy.participation.timer.clock.fleet
    assert bound.sizes == {0: 100, 1: 100, 2: 100}  # the sizes the clients reported
    for t in (1, 2):
        times = [client_seconds(bound.round_profile(pid, t), STEPS, B, C_EX, SIZE, SIZE)
                 for pid in range(3)]
        assert strategy.round_log(t)[C.LOG_SIM_SECONDS] == pytest.approx(max(times))


def test_an_async_task_is_timed_on_its_own_draw_of_the_fleet(monkeypatch):
    fleet = FlashFleet(seed=0, speed_noise=0.5)
    strategy = FedBuff(buffer_size=2, concurrency=2, **KW, clock=SimClock(fleet, C_EX))
    tasks = record_tasks(monkeypatch)
    run(strategy, rounds=4)
    differ = 0
    for task in tasks.values():  # task n: the fleet's round-n profile, as a round would
        pid, n = task.partition_id, task.number + 1
        took = client_seconds(fleet.round_profile(pid, n), STEPS, B, C_EX, SIZE, SIZE)
        assert task.done_at - task.sent_at == pytest.approx(took)
        differ += took != pytest.approx(
            client_seconds(fleet.profile(pid), STEPS, B, C_EX, SIZE, SIZE))
    assert len(tasks) >= 8 and differ == len(tasks)  # none on the mean profile


def record_tasks(monkeypatch) -> dict:
    """Task number -> AsyncTask of every task the asynchronous strategies make from now."""
    tasks = {}
    new_task = AsyncTasks.new_task

    def recording(self, *args, **kwargs):
        task = new_task(self, *args, **kwargs)
        tasks[task.number] = task
        return task

    monkeypatch.setattr(AsyncTasks, "new_task", recording)
    return tasks


def test_dynamicfl_whose_sync_events_wait_for_every_client_refuses_dropout():
    with pytest.raises(ValueError, match=r"dropout=0\.2 is not modelled here.*dropout=0"):
        DynamicFL(query_client_info=True, clock=SimClock(FLEET, dropout=0.2))
    DynamicFL(query_client_info=True, clock=SimClock(FLEET))


def test_an_async_task_drops_out_by_its_own_draw_and_counts_until_it_dropped(monkeypatch):
    seed, p = 0, 0.5
    strategy = FedBuff(buffer_size=2, concurrency=2, **KW, seed=seed,
                       clock=SimClock(FLEET, C_EX, dropout=p))
    tasks = record_tasks(monkeypatch)
    run(strategy, rounds=5)
    compute = {pid: STEPS * B * C_EX / FLEET.profile(pid).speed for pid in range(3)}
    for task in tasks.values():  # task n's draw: default_rng([seed, n, p, DROPOUT_TAG])
        drops, fraction = np.random.default_rng(
            [seed, task.number + 1, task.partition_id, DROPOUT_TAG]).random(2)
        assert task.dropped_out == (drops < p)
        took = (2 * T + compute[task.partition_id]) * (fraction if drops < p else 1.0)
        assert task.done_at - task.sent_at == pytest.approx(took)
    handled = [t for n, t in tasks.items() if n not in strategy.tasks.in_flight]
    logs = [strategy.round_log(t) for t in range(1, 6)]
    logged = [key for log in logs for key in log[C.LOG_DROPPED_OUT]]
    assert sorted(logged) == sorted(str(t.partition_id) for t in handled if t.dropped_out)
    assert sum(log[C.LOG_CLIENTS_DROPPED_OUT] for log in logs) == len(logged) > 0
    assert sum(log[C.LOG_CLIENTS_FAILED] for log in logs) == len(logged)
    assert sum(log[C.LOG_CLIENTS_RECEIVED] for log in logs) == len(handled) - len(logged)
    assert all(log[C.LOG_BUFFER_FILL] == 2 for log in logs)  # dropped replies never fill it


# ----------------------------------------------------------------- bad input
@pytest.mark.parametrize("kwargs, message", [
    ({"speed_noise": -0.1}, r"speed_noise .* >= 0, got -0\.1"),
    ({"speed_noise": math.nan}, r"speed_noise .* got nan"),
    ({"speed_noise": True}, r"speed_noise .* got True"),
    ({"correlation": 1.5}, r"correlation .* in \[0, 1\], got 1\.5"),
    ({"availability": 2.0}, r"availability must be in \[0, 1\], got 2\.0"),
])
def test_bad_fleet_arguments_are_refused_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FlashFleet(**kwargs)


@pytest.mark.parametrize("dropout", [1.0, -0.1, math.inf, "0.2"])
def test_a_bad_dropout_is_refused(dropout):
    with pytest.raises(ValueError, match=r"dropout .* in \[0, 1\), got"):
        SimClock(FLEET, dropout=dropout)


@pytest.mark.parametrize("user, keys", [
    ({"device-dropout": 0.2}, ["device-dropout=0.2", "device-profiles='none'"]),
    ({"device-profiles": "lognormal", "device-partition-correlation": 0.5},
     ["device-partition-correlation=0.5", "device-profiles='lognormal'"]),
    ({"device-profiles": "flash", "device-dropout": 1.0}, ["device-dropout=1.0", "[0, 1)"]),
    ({"device-profiles": "flash", "device-speed-noise": -1.0}, ["device-speed-noise=-1.0"]),
    ({"device-profiles": "flash", "device-dropout": 0.1, "strategy": "dynamicfl"},
     ["device-dropout=0.1", "strategy='dynamicfl'"]),
])
def test_bad_run_config_values_are_refused_with_a_fix(user, keys):
    with pytest.raises(ConfigError) as caught:
        check_run_config(user)
    message = str(caught.value)
    assert all(key in message for key in keys), message
    assert "Set it with: flwr run" in message and caught.value.fix


def test_the_run_config_builds_the_flash_clock():
    cfg = check_run_config({"device-profiles": "flash", "device-dropout": 0.25, "seed": 4,
                            "device-speed-noise": 0.0, "device-partition-correlation": 0.5})
    clock = device_clock(cfg, 0.01)
    assert clock.dropout == 0.25 and clock.seconds_per_example == 0.01
    assert (clock.fleet.seed, clock.fleet.speed_noise, clock.fleet.correlation) == (4, 0.0, 0.5)
    assert clock.calibrated(0.02).dropout == 0.25
    assert device_clock(check_run_config({"device-profiles": "lognormal"})).dropout == 0.0


def copy_data(tmp_path):
    folder = tmp_path / "flash"
    shutil.copytree(FLASH_DATA, folder)
    return folder


def rewrite(folder, name, change):
    data = json.loads((folder / name).read_text())
    change(data)
    (folder / name).write_text(json.dumps(data))


@pytest.mark.parametrize("name, change, message", [
    ("real2benchmark.json", lambda d: d.update({"CPH1909": "Nokia 3310"}),
     (r"real2benchmark\.json: device 'CPH1909' maps to 'Nokia 3310', which "
      r"benchmark2score\.json does not list")),
    ("real2benchmark.json", lambda d: d.update({"CPH1909": 7}), r"device 'CPH1909' maps to 7"),
    ("benchmark2score.json", lambda d: d.update({"Realme C2": -5}),
     r"benchmark2score\.json: the score of 'Realme C2' must be a finite number > 0, got -5"),
    ("speed_distri.json", lambda d: d[next(iter(d))].update({"down_u": 0}),
     r"speed_distri\.json: user '.*': down_u must be a finite number > 0"),
    ("speed_distri.json", lambda d: d.update({"x": [1, 2]}), r"user 'x' must be an object"),
    ("speed_distri.json", lambda d: d.clear(), r"must be a non-empty JSON object"),
])
def test_a_bad_data_file_is_refused_naming_the_file_and_entry(tmp_path, name, change, message):
    folder = copy_data(tmp_path)
    rewrite(folder, name, change)
    with pytest.raises(ValueError, match=message):
        load_population(folder)


def test_a_data_file_that_is_not_json_is_named(tmp_path):
    folder = copy_data(tmp_path)
    (folder / "benchmark2score.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"benchmark2score\.json' does not load"):
        load_population(folder)
    assert flash_fleet.load_population() is flash_fleet.load_population()  # the packaged one


# ----------------------------------------------------------------- the app
FLASH_RUN = {"num-server-rounds": 3, "seed": 2, "device-profiles": "flash",
             "device-dropout": 0.4, "device-partition-correlation": 1.0, "checkpoint-every": 2}


@pytest.mark.usefixtures("processes")
def test_the_app_runs_the_flash_fleet_logs_dropouts_and_resumes_to_the_same_clock(tmp_path):
    from simulation.reliability import SimulatedKill, run_inprocess  # noqa: PLC0415
    from tests.reliability_common import config, without_timings  # noqa: PLC0415
    from tests.reliability_common import run as run_app  # noqa: PLC0415

    _, run_dir, rounds, _ = run_app("fedavg", tmp_path / "full", 4, **FLASH_RUN)
    dropped = 0
    for t, r in enumerate(rounds[1:], 1):
        points = [pid for pid in range(4)
                  if np.random.default_rng([2, t, pid, DROPOUT_TAG]).random() < 0.4]
        assert r[C.LOG_DROPPED_OUT] == [str(pid) for pid in points]
        assert r[C.LOG_CLIENTS_DROPPED_OUT] == len(points)
        assert r[C.LOG_CLIENTS_RECEIVED] == 4 - len(points) and r[C.LOG_SIM_SECONDS] > 0
        dropped += len(points)
    assert 0 < dropped < 12
    profiles = (run_dir / "device_profiles.csv").read_text().splitlines()
    assert len(profiles) == 5  # the header and the 4 partitions' mean profiles
    killed = config("fedavg", tmp_path / "killed", **FLASH_RUN)
    with pytest.raises(SimulatedKill):
        run_inprocess(killed, 4, kill_after_round=2)
    killed_dir = next((tmp_path / "killed").iterdir())
    _, _, resumed, _ = run_app("fedavg", tmp_path / "resumed", 4, **FLASH_RUN,
                               **{"resume-from": str(killed_dir)})
    assert without_timings(resumed) == without_timings(rounds)


@pytest.mark.usefixtures("processes")
def test_the_app_runs_fedbuff_on_the_flash_fleet_with_dropout(tmp_path):
    from tests.reliability_common import run as run_app  # noqa: PLC0415

    run = {**FLASH_RUN, "async-concurrency": 3, "fedbuff-buffer-size": 2,
           "num-server-rounds": 6}
    check_run_config({**run, "strategy": "fedbuff"})  # FedBuff takes the fleet's dropout
    _, _, rounds, _ = run_app("fedbuff", tmp_path, 4, **run)
    logged = [key for r in rounds[1:] for key in r[C.LOG_DROPPED_OUT]]
    assert 0 < len(logged) == sum(r[C.LOG_CLIENTS_DROPPED_OUT] for r in rounds[1:])
    assert all(r[C.LOG_BUFFER_FILL] == 2 and r[C.LOG_SIM_SECONDS] > 0 for r in rounds[1:])
