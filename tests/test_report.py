"""Report metrics against hand-computed numbers, and the report files on fake runs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from simulation.metrics import (best_so_far, bytes_to_target, cumulative_bytes, has_clock,
                                rounds_to_target, sim_elapsed, sim_seconds_to_target,
                                updates_to_target)
from simulation.report import build_report, collect, panels_of
from strategies import contract as C


def records(accuracies, bytes_per_round=(10, 10)):
    out = []
    for r, acc in enumerate(accuracies):
        record = {"round": r, "accuracy": acc, "loss": 1.0}
        if r > 0:
            record[C.LOG_BYTES_UP], record[C.LOG_BYTES_DOWN] = bytes_per_round
        out.append(record)
    return out


def test_best_so_far_is_the_running_maximum():
    assert best_so_far([0.1, 0.5, 0.3, 0.6]).tolist() == [0.1, 0.5, 0.5, 0.6]


def test_rounds_to_target_interpolates_on_the_best_so_far_curve():
    # best-so-far 0.1, 0.5, 0.5, 0.7: 0.6 is crossed halfway between rounds 2 and 3
    assert rounds_to_target(records([0.1, 0.5, 0.3, 0.7]), 0.6) == pytest.approx(2.5)
    assert rounds_to_target(records([0.1, 0.5, 0.3, 0.7]), 0.5) == pytest.approx(1.0)
    assert rounds_to_target(records([0.65, 0.5]), 0.6) == 0.0
    assert rounds_to_target(records([0.1, 0.2]), 0.6) is None


def test_bytes_to_target_uses_cumulative_bytes():
    recs = records([0.1, 0.5, 0.3, 0.7])
    assert cumulative_bytes(recs).tolist() == [0, 20, 40, 60]
    assert bytes_to_target(recs, 0.6) == pytest.approx(50.0)


def test_rounds_without_evaluation_are_skipped():
    # eval-every=2: rounds 1 and 3 have no accuracy; the curve is 0.1 (r0), 0.5 (r2), 0.7 (r4)
    recs = records([0.1, None, 0.5, None, 0.7])
    for record in recs:
        if record["accuracy"] is None:
            del record["accuracy"], record["loss"]
    assert rounds_to_target(recs, 0.6) == pytest.approx(3.0)  # halfway between rounds 2 and 4
    # cumulative bytes at rounds 0, 2, 4: 0, 40, 80 -> 0.6 crossed at 60
    assert bytes_to_target(recs, 0.6) == pytest.approx(60.0)


def fake_run(folder, variant, seed, accuracies):
    run = folder / variant / f"seed{seed}" / f"2026-{variant}-{seed}"
    run.mkdir(parents=True)
    (run / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records(accuracies)))
    (run / "final_model.pt").write_bytes(b"x")


def test_report_tables_and_plots(tmp_path):
    fake_run(tmp_path, "a", 0, [0.1, 0.5, 0.7])
    fake_run(tmp_path, "a", 1, [0.1, 0.3, 0.5])
    fake_run(tmp_path, "b", 0, [0.1, 0.8, 0.6])
    table = build_report(tmp_path, tmp_path / "out", [0.6])
    lines = table.splitlines()
    # a: final 0.7, 0.5 -> 60.00 ± 14.14; best the same; 0.6 reached by seed 0 only at round 1.5
    assert lines[2] == "| a | 2 | 60.00 ± 14.14 | 60.00 ± 14.14 | 1.5 (1/2) | 0.0 |"
    # b: final 0.6, best 0.8; 0.6 at round 0.714... (0.1 -> 0.8)
    assert lines[3].startswith("| b | 1 | 60.00 | 80.00 | 0.7 (1/1) |")
    for name in ("report.md", "report.csv", "accuracy_vs_round.png", "accuracy_vs_bytes.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0
    assert np.isclose(
        float((tmp_path / "out" / "report.csv").read_text().splitlines()[1].split(",")[3]), 0.6
    )


def test_speedup_against_the_baseline_named_by_prefix(tmp_path):
    fake_run(tmp_path, "iid-sgd", 0, [0.1, 0.2, 0.3, 0.4, 0.6])  # 0.6 at round 4
    fake_run(tmp_path, "iid-avg", 0, [0.1, 0.7])  # 0.6 at 0.1 + 0.5/0.6 -> 0.8333
    fake_run(tmp_path, "niid-sgd", 0, [0.1, 0.2])  # never: 1 round budget
    fake_run(tmp_path, "niid-avg", 0, [0.1, 0.2, 0.6])  # 0.6 at round 2
    table = build_report(
        tmp_path, tmp_path / "out", [0.6], {"iid-": "iid-sgd", "niid-": "niid-sgd"}
    )
    speedups = table.split("Speedup in rounds to target against the baseline:")[1].split(
        "Communication"
    )[0]
    assert "| iid-avg | iid-sgd | 4.8× |" in speedups  # 4 / 0.8333
    assert "| niid-avg | niid-sgd | ≥ 0.5× |" in speedups  # baseline's 1 round / 2
    assert not [
        line for line in speedups.splitlines() if line.startswith("| iid-sgd |")
    ]  # no row for itself


def test_plot_panels_follow_the_baseline_prefixes():
    variants = ["c2-fedavg", "c2-ag", "dir0.1-fedavg", "dir0.1-ag", "central"]
    panels = panels_of(
        variants, {"c2-": "c2-fedavg", "dir0.1-": "dir0.1-fedavg", "dir0.1-a": "dir0.1-fedavg"}
    )
    # longest matching prefix wins; an unmatched variant gets the shared "" panel
    assert panels == {
        "c2-": ["c2-fedavg", "c2-ag"],
        "dir0.1-": ["dir0.1-fedavg"],
        "dir0.1-a": ["dir0.1-ag"],
        "": ["central"],
    }
    assert panels_of(variants, {}) == {"": variants}


def test_communication_table_totals_bytes_and_averages_dynamicfl_costs(tmp_path):
    for seed, kappa in enumerate((0.3, 0.5)):
        run = tmp_path / "dyn" / f"seed{seed}" / "run"
        run.mkdir(parents=True)
        recs = records([0.1, 0.2, 0.3], bytes_per_round=(1e6, 2e6))  # 3 MB a round, 2 rounds
        for record in recs[1:]:
            record.update({C.LOG_KAPPA_HAT: kappa, C.LOG_SYNC_EVENTS: 4,
                           C.LOG_DYNAMICFL_GROUP_SIZE: 1 + seed})
        (run / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        (run / "final_model.pt").write_bytes(b"x")
    fake_run(tmp_path, "fedavg", 0, [0.1, 0.2, 0.3])  # logs no kappa-hat: "-"
    table = build_report(tmp_path, tmp_path / "out", [0.6]).split(
        "Communication (means over seeds):"
    )[1]
    assert "| dyn | 6.0 | 0.4 | 4 | 1.5 |" in table
    assert "| fedavg | 0.0 | - | - | - |" in table


def test_drift_table_averages_the_layer_cosines_over_rounds_and_seeds(tmp_path):
    for seed, cosines in enumerate(([0.2, 0.4], [0.6, 0.8])):
        run = tmp_path / "iid" / f"seed{seed}" / "run"
        run.mkdir(parents=True)
        recs = records([0.1, 0.2, 0.3])
        recs[1][C.LOG_DRIFT_COSINE] = {"conv1": cosines[0], "fc1": 0.5}
        recs[2][C.LOG_DRIFT_COSINE] = {"conv1": cosines[1], "fc1": 0.5}
        (run / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        (run / "final_model.pt").write_bytes(b"x")
    table = build_report(tmp_path, tmp_path / "out", [0.6])
    assert "| variant | conv1 | fc1 |" in table
    assert "| iid | 0.500 | 0.500 |" in table


def test_results_rebuilds_each_experiment_with_its_own_targets(tmp_path):
    experiments, runs, out = tmp_path / "experiments", tmp_path / "runs", tmp_path / "docs"
    experiments.mkdir()
    (experiments / "alpha.toml").write_text(
        'title = "Alpha"\nclaim = "It falls."\ntargets = [0.5]\nseeds = [0]\n[variants.a]\n'
    )
    (experiments / "no_runs_yet.toml").write_text("seeds = [0]\n[variants.a]\n")
    fake_run(runs / "alpha", "a", 0, [0.1, 0.7])
    from simulation.results import rebuild_results  # noqa: PLC0415

    assert rebuild_results(experiments, runs, out, []) == ["alpha"]
    text = (out / "alpha" / "report.md").read_text()
    assert text.startswith("# Alpha\n\nIt falls.")
    assert "rounds to 50% |" in text and "rounds to 60%" not in text


def test_published_numbers_get_a_verdict_per_variant(tmp_path):
    fake_run(tmp_path, "dir-a", 0, [0.1, 0.86])  # 0.861 published: -0.1 points, agrees
    fake_run(tmp_path, "dir-a", 1, [0.1, 0.85])  # mean final 0.855: -0.6 points, agrees
    fake_run(tmp_path, "dir-b", 0, [0.1, 0.80])  # 0.866 published: below by 6.6 points
    fake_run(tmp_path, "dir-c", 0, [0.1, 0.90])  # 0.868: above by 3.2 points
    fake_run(tmp_path, "dir-d", 0, [0.1, 0.50])  # no published number
    published = {"dir-a": 0.861, "dir-b": 0.866, "dir-c": 0.868, "other": 0.5}
    table = build_report(tmp_path, tmp_path / "out", [0.6], published=published,
                         published_source="Table III", tolerance=0.015)
    assert "(Table III; final accuracy" in table
    assert ("| dir-a | 2 | 85.50 ± 0.71 | 85.50 ± 0.71 | 86.1 | -0.6 | agrees (within 1.5 "
            "points) |") in table
    assert "| dir-b | 1 | 80.00 | 80.00 | 86.6 | -6.6 | below by 6.6 points |" in table
    assert "| dir-c | 1 | 90.00 | 90.00 | 86.8 | +3.2 | above by 3.2 points |" in table
    assert "| dir-d | 1 | 50.00 | 50.00 | - | - | no published number |" in table
    import csv  # noqa: PLC0415

    with (tmp_path / "out" / "report.csv").open() as handle:
        rows = {r["variant"]: r for r in csv.DictReader(handle)}
    assert float(rows["dir-b"]["published"]) == pytest.approx(0.866)
    assert float(rows["dir-b"]["final-minus-published"]) == pytest.approx(-0.066)
    assert rows["dir-a"]["verdict"].startswith("agrees") and rows["dir-d"]["published"] == ""


def test_results_passes_the_sweep_files_published_numbers(tmp_path):
    experiments, runs, out = tmp_path / "experiments", tmp_path / "runs", tmp_path / "docs"
    experiments.mkdir()
    (experiments / "bench.toml").write_text(
        'title = "B"\nclaim = "c"\ntargets = [0.5]\nseeds = [0]\ntolerance = 0.01\n'
        'published-source = "Table 9"\n[published]\na = 0.69\n[variants.a]\n')
    fake_run(runs / "bench", "a", 0, [0.1, 0.7])
    from simulation.results import rebuild_results  # noqa: PLC0415

    assert rebuild_results(experiments, runs, out, []) == ["bench"]
    text = (out / "bench" / "report.md").read_text()
    assert "(Table 9; final accuracy" in text and "agrees (within 1 points)" in text


# ---------------------------------------------------------------- the simulated clock
def clocked(accuracies, sim_seconds, stragglers=0):
    recs = records(accuracies)
    elapsed = 0.0
    for record, seconds in zip(recs[1:], sim_seconds):
        elapsed += seconds
        record.update({C.LOG_SIM_SECONDS: seconds, C.LOG_SIM_ELAPSED: elapsed,
                       C.LOG_CLIENTS_STRAGGLERS: stragglers, C.LOG_CLIENTS_DROPPED: 0,
                       C.LOG_CLIENTS_UNAVAILABLE: 1})
    return recs


def clocked_run(folder, variant, seed, accuracies, sim_seconds, stragglers=0):
    run = folder / variant / f"seed{seed}" / "run"
    run.mkdir(parents=True)
    text = "".join(json.dumps(r) + "\n" for r in clocked(accuracies, sim_seconds, stragglers))
    (run / "rounds.jsonl").write_text(text)
    (run / "final_model.pt").write_bytes(b"x")


def test_sim_seconds_to_target_interpolates_on_simulated_time():
    # elapsed 0, 10, 40, 50; best-so-far 0.1, 0.5, 0.5, 0.7: 0.6 halfway from 40 to 50
    recs = clocked([0.1, 0.5, 0.3, 0.7], [10.0, 30.0, 10.0])
    assert sim_elapsed(recs).tolist() == [0.0, 10.0, 40.0, 50.0]
    assert sim_seconds_to_target(recs, 0.6) == pytest.approx(45.0)
    assert sim_seconds_to_target(recs, 0.9) is None
    assert sim_seconds_to_target(records([0.1, 0.7]), 0.6) is None  # no clock logged
    assert has_clock(recs) and not has_clock(records([0.1, 0.7]))


def test_report_has_sim_seconds_columns_speedup_and_plot(tmp_path):
    clocked_run(tmp_path, "fedavg", 0, [0.1, 0.5, 0.7], [100.0, 100.0])  # 0.6 at 150 s
    clocked_run(tmp_path, "fedavg", 1, [0.1, 0.7, 0.8], [200.0, 100.0])  # 0.6 at 200 * 5/6
    clocked_run(tmp_path, "fedprox", 0, [0.1, 0.8, 0.8], [50.0, 50.0], stragglers=2)  # 0.6: 35.7
    table = build_report(tmp_path, tmp_path / "out", [0.6], baselines={"fed": "fedavg"})
    lines = table.splitlines()
    # the longest run is 300 s (> 2 min): simulated times in minutes (report.csv: seconds)
    assert lines[0].endswith("| rounds to 60% | MB to 60% | sim min to 60% |")
    assert lines[2].endswith(f"| {(150 + 1000 / 6) / 2 / 60:.4g} |")
    assert lines[3].endswith(f"| {50 * 5 / 7 / 60:.4g} |")
    header = (tmp_path / "out" / "report.csv").read_text().splitlines()[0].split(",")
    assert "sim-seconds-to-0.6" in header and "sim-seconds-total" in header
    speedup = table.split("Speedup in simulated time to target against the baseline:")[1]
    assert f"| fedprox | fedavg | {((150 + 1000 / 6) / 2) / (50 * 5 / 7):.1f}× |" in speedup
    clock = table.split("Simulated time (device profiles; means over rounds and seeds):")[1]
    # fedavg: 200 and 300 s in all -> 250 s = 4.17 min; 125 s a round (> 2 min: 2.083 min)
    assert "| variant | simulated time per run (min) | sim min / round |" in clock
    assert "| fedavg | 4.17 | 2.083 | 0 | 0 | 1 |" in clock
    assert "| fedprox | 1.67 | 0.8333 | 2 | 0 | 1 |" in clock
    assert (tmp_path / "out" / "accuracy_vs_sim_time.png").stat().st_size > 0


def test_report_without_the_clock_has_no_sim_columns(tmp_path):
    fake_run(tmp_path, "a", 0, [0.1, 0.7])
    table = build_report(tmp_path, tmp_path / "out", [0.6])
    assert "sim s" not in table and "Simulated time" not in table
    assert not (tmp_path / "out" / "accuracy_vs_sim_time.png").exists()
    assert "sim-seconds" not in (tmp_path / "out" / "report.csv").read_text()


def test_client_updates_to_target_is_a_table_of_its_own(tmp_path):
    # 10 updates per round: best-so-far 0.1, 0.5, 0.7 -> 0.6 halfway through round 2 = 15
    for seed, received in ((0, 10), (1, 20)):
        run = tmp_path / "fedbuff" / f"seed{seed}" / "run"
        run.mkdir(parents=True)
        recs = records([0.1, 0.5, 0.7])
        for record in recs[1:]:
            record[C.LOG_CLIENTS_RECEIVED] = received
        (run / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        (run / "final_model.pt").write_bytes(b"x")
    assert updates_to_target(records([0.1, 0.7]), 0.6) == 0.0  # nothing received logged
    table = build_report(tmp_path, tmp_path / "out", [0.6, 0.9])
    updates = table.split("Client updates aggregated until the target")[1]
    assert "| fedbuff | 22 (2/2) | not reached (0/2) | 30 |" in updates  # (15 + 30) / 2


def test_a_run_kept_without_its_model_file_still_counts_when_its_log_is_complete(tmp_path):
    """docs/results/run-logs keep config.json and rounds.jsonl, not final_model.pt: a run
    whose last record is its evaluated last round is finished; one cut short is not."""
    from fedapp.run_log import run_finished

    done = tmp_path / "v" / "seed0" / "done"
    cut = tmp_path / "v" / "seed1" / "cut"
    for run, last in ((done, 2), (cut, 1)):
        run.mkdir(parents=True)
        (run / "config.json").write_text(json.dumps({"run-config": {"num-server-rounds": 2}}))
        (run / "rounds.jsonl").write_text("".join(
            json.dumps({"round": r, "accuracy": 0.5, "loss": 1.0}) + "\n"
            for r in range(last + 1)))
    assert run_finished(done) and not run_finished(cut)
    assert run_finished(tmp_path / "v" / "seed0" / "nothing-here") is False
    assert [p.name for p, _ in collect(tmp_path)["v"]] == ["done"]
