"""The comparison protocol (simulation.protocol, .stats, .tuning, .provenance, the report's
protocol section): claims refused unless fair, verdicts by the written rule, tuning on equal
budgets, provenance of every run.

Run directories are written by hand (``rounds.jsonl`` records with the keys the ServerApp
logs); no run is started here."""

from __future__ import annotations

import csv
import json
import math
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from simulation import protocol as P
from simulation import provenance, stats, sweep, tuning
from simulation.metrics import budget_to_target, last_mean
from simulation.report import write_report
from simulation.report_protocol import tuning_markdown

# Student's t quantiles t_{0.975, df} from the published tables (e.g. NIST/SEMATECH
# e-Handbook, Table 1.3.6.7.2), and P(T <= 2) with 4 degrees of freedom = 0.94194
T_TABLE = {1: 12.706, 2: 4.303, 4: 2.776, 9: 2.262, 29: 2.045}

BASE = """
seeds = [0, 1, 2, 3, 4]
num-supernodes = 100

[base]
num-server-rounds = 20
fraction-train = 0.1
device-profiles = "lognormal"
lr = 0.05

[variants.oort]
strategy = "fedavg"
selection = "oort"
over-commitment = 0.0

[variants.over]
strategy = "fedavg"
fraction-train = 0.08
over-commitment = 0.25

[variants.prox-deadline]
strategy = "fedprox"
proximal-mu = 0.01
round-deadline = 5.0

[variants.fedavgm]
strategy = "fedavg"
server-momentum = 0.9
"""

CLAIM = """
[[claims]]
name = "oort-time"
statement = "Oort reaches 75 % sooner"
paper = "Lai et al., OSDI 2021, Table 1"
kind = "selection"
measure = "budget-to-target"
budget = "sim-seconds"
target = 0.75
effect = 1.3
candidate = "oort"
baselines = ["over", "prox-deadline", "fedavgm"]
"""


def load(tmp_path: Path, text: str) -> dict:
    path = tmp_path / "s.toml"
    path.write_text(text)
    return sweep.load_sweep(path)


# ---------------------------------------------------------------- statistics
@pytest.mark.parametrize("df, t", sorted(T_TABLE.items()))
def test_t_quantiles_match_the_published_table(df, t):
    assert stats.t_quantile(0.975, df) == pytest.approx(t, abs=5e-4)
    assert stats.t_cdf(stats.t_quantile(0.975, df), df) == pytest.approx(0.975, abs=1e-9)


def test_t_cdf_is_symmetric_and_matches_a_tabled_value():
    assert stats.t_cdf(2.0, 4) == pytest.approx(0.94194, abs=1e-5)
    assert stats.t_cdf(-2.0, 4) == pytest.approx(1 - 0.94194, abs=1e-5)
    assert stats.t_cdf(0.0, 7) == 0.5
    assert stats.t_quantile(0.975, 1e7) == pytest.approx(1.959964, abs=1e-5)  # the normal's


def test_mean_interval_and_paired_test_by_hand():
    values = [1.0, 2.0, 3.0, 4.0, 5.0]  # mean 3, s = sqrt(2.5), half = 2.776 s / sqrt(5)
    interval = stats.mean_interval(values)
    half = stats.t_quantile(0.975, 4) * math.sqrt(2.5) / math.sqrt(5)
    assert (interval.mean, interval.low, interval.high) == pytest.approx((3, 3 - half, 3 + half))
    diffs = [0.1, 0.2, 0.15, 0.12, 0.3]
    t = np.mean(diffs) / (np.std(diffs, ddof=1) / math.sqrt(5))
    assert stats.paired_t_pvalue(diffs) == pytest.approx(2 * (1 - stats.t_cdf(t, 4)))
    assert stats.paired_t_pvalue([0.2]) is None
    assert stats.paired_t_pvalue([0.0, 0.0]) == 1.0
    assert stats.mean_interval([0.7]).n == 1


# ---------------------------------------------------------------- claims refused unless fair
def test_a_fair_claim_loads(tmp_path):
    spec = load(tmp_path, BASE + CLAIM)
    [claim] = P.check_protocol(spec)
    assert claim.baselines == ("over", "prox-deadline", "fedavgm")
    # clients in flight: ceil(1.25 * floor(0.08 * 100)) = 10 = floor(0.1 * 100)
    assert {v: P.clients_in_flight(P.variant_config(spec, v), spec)
            for v in spec["variants"]} == {"oort": 10, "over": 10, "prox-deadline": 10,
                                           "fedavgm": 10}


@pytest.mark.parametrize("dropped, says", [
    ("over", "over-commitment"),
    ("prox-deadline", "deadline with FedProx's partial work"),
    ("fedavgm", "FedAvgM"),
])
def test_a_selection_claim_without_a_strongest_baseline_is_refused(tmp_path, dropped, says):
    text = (BASE + CLAIM).replace(f', "{dropped}"', "").replace(f'"{dropped}", ', "")
    with pytest.raises(ValueError, match="strongest synchronous baselines") as caught:
        load(tmp_path, text)
    assert says in str(caught.value) and "oort-time" in str(caught.value)


def test_unequal_clients_in_flight_are_refused_with_the_numbers(tmp_path):
    text = (BASE + CLAIM).replace("over-commitment = 0.25", "over-commitment = 0.3")
    with pytest.raises(ValueError, match=r"over 11.*clients in flight|clients in flight.*over 11"):
        load(tmp_path, text)


def test_an_async_candidate_counts_its_concurrency(tmp_path):
    text = BASE.replace('[variants.oort]\nstrategy = "fedavg"\nselection = "oort"',
                        '[variants.oort]\nstrategy = "fedbuff"\nasync-concurrency = 20')
    with pytest.raises(ValueError, match="oort 20"):
        load(tmp_path, text + CLAIM.replace('"selection"', '"async"'))
    assert P.check_protocol(load(tmp_path, text.replace("async-concurrency = 20",
                                                        "async-concurrency = 10")
                                 + CLAIM.replace('"selection"', '"async"')))


def test_fewer_than_five_seeds_are_refused(tmp_path):
    with pytest.raises(ValueError, match="at least 5 seeds"):
        load(tmp_path, (BASE + CLAIM).replace("[0, 1, 2, 3, 4]", "[0, 1, 2]"))


@pytest.mark.parametrize("edit, says", [
    (('effect = 1.3', 'effect = -1.3'), "ratio baseline / candidate"),
    (('measure = "budget-to-target"', 'measure = "accuracy"'), "difference of accuracies"),
    (('budget = "sim-seconds"', 'budget = "hours"'), "budget = 'hours'"),
    (('candidate = "oort"', 'candidate = "nope"'), "not variants"),
    (('name = "oort-time"', 'name = "oort-time"\ncolour = 1'), "unknown key"),
    (('target = 0.75\n', ''), "missing target"),
    (('candidate = "oort"', 'candidate = "over"'), "among its baselines"),
])
def test_a_bad_claim_names_the_key_and_the_fix(tmp_path, edit, says):
    with pytest.raises(ValueError, match=None) as caught:
        load(tmp_path, (BASE + CLAIM).replace(*edit))
    assert says in str(caught.value) and "oort-time" in str(caught.value)


def test_a_claim_of_kind_other_needs_no_strongest_baselines(tmp_path):
    text = (BASE + CLAIM).replace('"selection"', '"other"').replace(
        'baselines = ["over", "prox-deadline", "fedavgm"]', 'baselines = ["fedavgm"]')
    assert P.check_protocol(load(tmp_path, text))[0].kind == "other"


# ---------------------------------------------------------------- the verdict rule
def records(times: list[float], accuracies: list[float], updates: int = 10) -> list[dict]:
    """Round 0 (the initial model) and one record per round, as the ServerApp logs them."""
    out = [{"round": 0, "accuracy": 0.1, "sim-elapsed": 0.0, "clients-received": 0}]
    for i, (t, a) in enumerate(zip(times, accuracies), 1):
        out.append({"round": i, "accuracy": a, "sim-elapsed": t, "clients-received": updates})
    return out


def claim(measure="budget-to-target", effect=1.3) -> P.Claim:
    return P.Claim("c", "s", "p", "selection", measure, "sim-seconds", effect, "cand",
                   ("base",), target=0.75 if measure == "budget-to-target" else None)


def test_budget_effect_is_the_log_ratio_of_interpolated_crossings():
    cand = records([10, 20, 30], [0.5, 0.8, 0.9])  # 0.75 at 10 + 5/6 * 10
    base = records([20, 40, 60], [0.5, 0.7, 0.8])  # 0.75 at 40 + 0.5 * 20 = 50
    assert budget_to_target(cand, "sim-seconds", 0.75) == pytest.approx(10 + 25 / 3)
    effect, c_bound, b_bound = P.paired_effect(claim(), cand, base)
    assert effect == pytest.approx(math.log(50 / (10 + 25 / 3)))
    assert (c_bound, b_bound) == (False, False)


def test_a_run_that_never_reaches_the_target_enters_as_a_bound():
    cand = records([10, 20], [0.5, 0.6])
    base = records([20, 40], [0.5, 0.8])
    effect, c_bound, b_bound = P.paired_effect(claim(), cand, base)
    assert c_bound and not b_bound  # the candidate spent 20 s in all
    assert effect == pytest.approx(math.log((20 + 20 * 0.25 / 0.3) / 20))


def test_accuracy_effect_is_taken_within_the_shorter_runs_budget():
    cand = records([10 * i for i in range(1, 31)], [0.8] * 20 + [0.9] * 10)  # 300 s
    base = records([10 * i for i in range(1, 21)], [0.7] * 20)  # 200 s
    effect, _, _ = P.paired_effect(claim("accuracy", -0.01), cand, base)
    assert effect == pytest.approx(0.1)  # cand's last 10 within 200 s are all 0.8
    assert last_mean(cand) == pytest.approx(0.9)


@pytest.mark.parametrize("effects, word", [
    ([math.log(x) for x in (2.0, 1.9, 2.1, 2.2, 1.8)], P.REPRODUCED),
    ([math.log(x) for x in (1.0, 1.05, 0.95, 1.02, 0.98)], P.NOT_REPRODUCED),
    ([math.log(x) for x in (0.7, 2.5, 1.4, 3.0, 0.9)], P.INCONCLUSIVE),
    ([math.log(x) for x in (2.0, 1.9, 2.1, 2.2)], P.INCONCLUSIVE),  # four seeds
    ([math.log(x) for x in (1.35, 1.32, 1.31, 1.4, 1.33)], P.REPRODUCED),  # mean >= 1.3, lo > 1
])
def test_the_verdict_rule_for_a_ratio_claim(effects, word):
    assert P.verdict(claim(), effects)[0] == word


def test_bounds_block_only_the_verdict_they_cannot_support():
    high = [math.log(x) for x in (2.0, 1.9, 2.1, 2.2, 1.8)]
    assert P.verdict(claim(), high, candidate_bounds=1)[0] == P.INCONCLUSIVE
    assert P.verdict(claim(), high, baseline_bounds=1)[0] == P.REPRODUCED
    low = [math.log(x) for x in (1.0, 1.05, 0.95, 1.02, 0.98)]
    assert P.verdict(claim(), low, baseline_bounds=2)[0] == P.INCONCLUSIVE
    assert P.verdict(claim(), low, candidate_bounds=2)[0] == P.NOT_REPRODUCED


def test_a_no_worse_than_claim_needs_the_interval_above_the_margin():
    c = claim("accuracy", -0.01)
    assert P.verdict(c, [0.001, -0.002, 0.0, 0.003, -0.001])[0] == P.REPRODUCED
    assert P.verdict(c, [-0.03, -0.025, -0.035, -0.028, -0.031])[0] == P.NOT_REPRODUCED
    assert P.verdict(c, [0.01, -0.03, 0.02, -0.04, 0.0])[0] == P.INCONCLUSIVE


def test_the_claim_verdict_needs_every_baseline():
    made = [SimpleNamespace(verdict=w) for w in (P.REPRODUCED, P.INCONCLUSIVE)]
    assert P.claim_verdict(made) == P.INCONCLUSIVE
    assert P.claim_verdict([SimpleNamespace(verdict=P.REPRODUCED)] * 2) == P.REPRODUCED
    made.append(SimpleNamespace(verdict=P.NOT_REPRODUCED))
    assert P.claim_verdict(made) == P.NOT_REPRODUCED


# ---------------------------------------------------------------- the report
def write_run(folder: Path, variant: str, seed: int, rows: list[dict]) -> Path:
    run = folder / variant / f"seed{seed}" / "20260101-000000-fedavg-run1"
    run.mkdir(parents=True)
    (run / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "config.json").write_text(json.dumps({"run-config": {
        "strategy": "fedavg", "num-server-rounds": len(rows) - 1, "seed": seed}}))
    return run


def test_the_report_computes_the_verdict_and_the_one_metric(tmp_path):
    folder, out = tmp_path / "runs", tmp_path / "report"
    rng = np.random.default_rng(0)
    runs = {"cand": [], "base": []}
    for seed in range(5):
        speed = {"cand": 2.0 + 0.1 * rng.standard_normal(), "base": 1.0}
        for variant, factor in speed.items():
            times = [10.0 * i / factor for i in range(1, 21)]
            acc = [min(0.9, 0.5 + 0.02 * i) for i in range(1, 21)]
            rows = records(times, acc)
            runs[variant].append((write_run(folder, variant, seed, rows), rows))
    c = claim()
    table = write_report(runs, out, [0.75], claims=[c])
    assert "## Protocol" in table and "the last 10 evaluations of a run" in table
    assert "last-10 mean accuracy (%)" in table and "final accuracy" not in table
    [row] = list(csv.DictReader((out / "claims.csv").open()))
    assert row["verdict"] == P.REPRODUCED and row["claim-verdict"] == P.REPRODUCED
    assert math.exp(float(row["mean"])) == pytest.approx(2.0, rel=0.1)
    assert "Verdict: **reproduced**" in (out / "report.md").read_text()
    assert "no run records its commit" in table


# ---------------------------------------------------------------- tuning
TUNED = BASE + """
[tuning]
seed = 100
grid = { lr = [0.02, 0.05, 0.1] }
"""


def test_tuning_points_cross_the_grid_with_a_variants_knob(tmp_path):
    text = TUNED.replace("proximal-mu = 0.01\n", "proximal-mu = 0.01\ntune = { proximal-mu = "
                         "[0.001, 0.01, 0.1] }\n")
    with pytest.raises(ValueError, match="tuning budgets differ: .*prox-deadline 9 runs"):
        load(tmp_path, text)
    text = text.replace("grid = { lr = [0.02, 0.05, 0.1] }", "grid = { lr = [0.02, 0.05, 0.1,"
                        " 0.2, 0.3, 0.4, 0.5, 0.6, 0.7] }").replace(
        "tune = { proximal-mu = [0.001, 0.01, 0.1] }",
        "tune = { lr = [0.02, 0.05, 0.1], proximal-mu = [0.001, 0.01, 0.1] }")
    spec = load(tmp_path, text)
    prox = tuning.points(spec, "prox-deadline")
    assert len(prox) == 9 and prox[1] == {"lr": 0.02, "proximal-mu": 0.01}
    assert tuning.point_name(prox[1]) == "lr=0.02+proximal-mu=0.01"
    assert sweep.check_variant_name(tuning.point_name(prox[1])) is None


def test_tuning_runs_validate_and_the_best_point_sets_the_seeds(tmp_path):
    spec = load(tmp_path, TUNED)
    out = tmp_path / "out"
    planned = tuning.tuning_runs(spec, out)
    assert len(planned) == 12 and planned[0].directory == out / "tuning/oort/lr=0.02/seed100"
    config = tuning.tuning_config(P.variant_config(spec, "oort"), planned[0], 100)
    assert config["evaluation-split"] == "validation" and config["seed"] == 100
    assert config["lr"] == 0.02 and config["selection"] == "oort"
    finished = {}
    for run in planned:  # lr 0.05 scores best for every variant; 0.02 and 0.1 tie below it
        score = 0.8 if run.values["lr"] == 0.05 else 0.7
        finished[run] = write_run(run.directory.parent.parent, run.point, 100,
                                  records([1.0] * 12, [score] * 12))
    chosen = tuning.choose(planned, finished, out)
    assert {v: c["values"] for v, c in chosen.items()} == {v: {"lr": 0.05}
                                                            for v in spec["variants"]}
    assert tuning.read_chosen(out) == json.loads(json.dumps(chosen))
    runs = sweep.plan(spec, out, chosen=chosen)
    assert len(runs) == 20 and {r.run_config["lr"] for r in runs} == {0.05}
    assert "evaluation-split" not in runs[0].run_config
    # a variant whose tuning has not finished runs no seed
    del finished[planned[0]]
    partial = tuning.choose(planned, finished, tmp_path / "other")
    assert "oort" not in partial and len(sweep.plan(spec, out, chosen=partial)) == 15


def test_a_tie_keeps_the_first_point_in_grid_order(tmp_path):
    spec = load(tmp_path, TUNED)
    planned = [r for r in tuning.tuning_runs(spec, tmp_path) if r.variant == "over"]
    finished = {r: write_run(tmp_path / "t", r.point, 100, records([1.0], [0.6]))
                for r in planned}
    assert tuning.choose(planned, finished, tmp_path)["over"]["point"] == "lr=0.02"


def test_the_sweep_runs_tuning_first_then_the_seeds_with_the_choice(tmp_path, monkeypatch):
    text = TUNED.replace("seeds = [0, 1, 2, 3, 4]", "seeds = [0, 1, 2, 3, 4]").replace(
        "[variants.over]", "[variants.over]\nseeds = [0]")
    spec = load(tmp_path, text)
    out = tmp_path / "out"
    calls = []

    def fake_run_app(run_config, federation, **kwargs):
        calls.append(run_config)
        score = 0.9 if run_config["lr"] == 0.1 else 0.5
        rows = records([1.0] * 20, [score] * 20)
        run = Path(run_config["output-dir"]) / "20260101-000000-fedavg-run1"
        run.mkdir(parents=True)
        (run / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (run / "final_model.pt").write_bytes(b"")  # the run ended
        return SimpleNamespace(returncode=0, status="ok", output="")

    monkeypatch.setattr(sweep, "run_app", fake_run_app)
    monkeypatch.setattr(sweep, "git_state", lambda: {"git-commit": "abc", "git-dirty": False})
    done = sweep.execute(spec, out, variants=["o*"])
    tuned = [c for c in calls if c.get("evaluation-split") == "validation"]
    assert len(tuned) == 6 and all(c["seed"] == 100 for c in tuned)
    assert calls.index(tuned[-1]) == 5  # every tuning run before any seed
    seeds = [c for c in calls if "evaluation-split" not in c]
    assert [(c["seed"], c["lr"]) for c in seeds] == [(s, 0.1) for s in range(5)] + [(0, 0.1)]
    assert len(done) == 6
    entries = provenance.read(done[0][1])  # every finished run records the code and seeds
    assert entries[0]["git-commit"] == "abc" and entries[0]["seeds"]["seed"] == 0


def test_a_variant_named_tuning_is_refused(tmp_path):
    with pytest.raises(ValueError, match="'tuning' would share"):
        load(tmp_path, TUNED + '\n[variants.tuning]\nstrategy = "fedavg"\n')


# ---------------------------------------------------------------- provenance
def test_provenance_records_the_commit_the_dirty_flag_and_the_seeds(tmp_path, processes):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.email=a@b", "-c", "user.name=a"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "f").write_text("1")
    subprocess.run([*git, "add", "f"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()
    assert provenance.git_state(repo) == {"git-commit": head, "git-dirty": False}
    (repo / "f").write_text("2")
    state = provenance.git_state(repo)
    assert state["git-dirty"] is True
    run = tmp_path / "run"
    run.mkdir()
    provenance.record(run, {"seed": 3, "partition-seed": -1, "lr": 0.1}, "ran", state)
    provenance.record(run, {"seed": 3, "partition-seed": -1}, "resumed", state)
    entries = provenance.read(run)
    assert [e["action"] for e in entries] == ["ran", "resumed"]
    assert entries[0]["seeds"] == {"partition-seed": 3, "seed": 3}
    assert "1 of 1 runs from a tree with uncommitted changes" in provenance.commits_line([run])
    assert provenance.git_state(tmp_path / "nowhere")["git-commit"] == provenance.UNKNOWN


def test_a_damaged_provenance_file_is_kept_aside_not_lost(tmp_path, capsys):
    (tmp_path / provenance.PROVENANCE).write_text("{not json")
    provenance.record(tmp_path, {"seed": 1}, "ran", {"git-commit": "abc", "git-dirty": False})
    assert (tmp_path / "provenance.json.bad").read_text() == "{not json"
    assert len(provenance.read(tmp_path)) == 1
    assert "unreadable provenance" in capsys.readouterr().out


def test_the_initial_models_evaluation_is_not_a_result():
    rows = records([1.0, 2.0], [0.5, 0.7])  # round 0 is logged at 0.1
    assert last_mean(rows) == pytest.approx(0.6)
    assert last_mean(rows[:1]) == pytest.approx(0.1)  # nothing trained: the only one there is


def test_a_baseline_is_judged_at_every_point_it_may_be_tuned_to(tmp_path):
    text = TUNED.replace("server-momentum = 0.9\n", "tune = { lr = [0.02, 0.05], "
                         "server-momentum = [0.5, 0.9] }\n") + CLAIM
    text = text.replace("grid = { lr = [0.02, 0.05, 0.1] }",
                        "grid = { lr = [0.02, 0.05, 0.1, 0.2] }")
    assert P.check_protocol(load(tmp_path, text))  # FedAvgM at each of its 4 points
    with pytest.raises(ValueError, match="lack FedAvgM"):  # one point without momentum
        load(tmp_path, text.replace("server-momentum = [0.5, 0.9]", "server-momentum = [0.0, 0.9]"))


def test_an_archived_tuned_sweep_continues_without_tuning_again(tmp_path, monkeypatch):
    from simulation.archive_logs import archive

    spec = load(tmp_path, TUNED.replace("[variants.over]", "[variants.over]\nseeds = [0]"))
    out, archived = tmp_path / "out", tmp_path / "archive" / "exp"
    calls = []

    def fake_run_app(run_config, federation, **kwargs):
        calls.append(run_config)
        rows = records([1.0] * 20, [0.9 if run_config["lr"] == 0.05 else 0.5] * 20)
        run = Path(run_config["output-dir"]) / "20260101-000000-fedavg-run1"
        run.mkdir(parents=True)
        (run / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (run / "config.json").write_text(json.dumps({"run-config": run_config}))
        (run / "device_profiles.csv").write_text("partition-id,speed\n0,1.0\n")
        (run / "final_model.pt").write_bytes(b"")
        return SimpleNamespace(returncode=0, status="ok", output="")

    monkeypatch.setattr(sweep, "run_app", fake_run_app)
    monkeypatch.setattr(sweep, "git_state", lambda: {"git-commit": "abc", "git-dirty": False})
    first = sweep.execute(spec, out, variants=["over"])
    assert len(calls) == 4 and len(first) == 1  # 3 tuning runs, one seed
    archive(out, archived, pages=tmp_path / "pages")
    assert tuning.read_chosen(archived)["over"]["point"] == "lr=0.05"
    [tuned] = list((archived / "tuning/over/lr=0.05/seed100").iterdir())
    assert sorted(p.name for p in tuned.iterdir()) == [
        "config.json.xz", "provenance.json.xz", "rounds.jsonl.xz"]
    calls.clear()
    assert len(sweep.execute(spec, archived, variants=["over"])) == 1 and calls == []


def test_the_results_readme_lists_every_claims_verdict_from_its_csv(tmp_path):
    from simulation.claims_index import BEGIN, END, write_claims_index

    folder, out = tmp_path / "runs", tmp_path / "results" / "exp"
    runs = {"cand": [], "base": []}
    for seed in range(5):
        for variant, factor in {"cand": 2.0 + 0.05 * seed, "base": 1.0}.items():
            rows = records([10.0 * i / factor for i in range(1, 21)],
                           [min(0.9, 0.5 + 0.02 * i) for i in range(1, 21)])
            runs[variant].append((write_run(folder, variant, seed, rows), rows))
    write_report(runs, out, [0.75], claims=[claim()])
    readme = tmp_path / "results" / "README.md"
    readme.write_text(f"# Results\n\n{BEGIN}\nold\n{END}\n\nafter\n")
    assert write_claims_index(readme, tmp_path / "results")
    text = readme.read_text()
    assert "old" not in text and text.endswith(f"{END}\n\nafter\n")
    [row] = [line for line in text.splitlines() if line.startswith("| [exp]")]
    assert "| **reproduced** |" in row and "base: 2.10× [2.00×, 2.20×]" in row and "p = " in row
    assert not write_claims_index(tmp_path / "nothing.md", tmp_path / "results")


def test_results_waits_for_an_experiment_with_only_tuning_runs(tmp_path, capsys):
    from simulation.results import rebuild_results

    experiments, runs, out = tmp_path / "exp", tmp_path / "runs", tmp_path / "out"
    experiments.mkdir()
    (experiments / "tuned.toml").write_text(TUNED)
    write_run(runs / "tuned" / "tuning" / "over", "lr=0.02", 100, records([1.0], [0.5]))
    assert rebuild_results(experiments, runs, out, []) == []
    assert "no finished seeded run" in capsys.readouterr().out


def test_a_tuned_variant_with_nothing_to_tune_is_refused_with_an_example(tmp_path):
    text = TUNED.replace("grid = { lr = [0.02, 0.05, 0.1] }\n", "")
    with pytest.raises(ValueError, match=r"nothing to tune \(e.g. grid = \{ lr = "):
        load(tmp_path, text)


def test_the_tuning_table_says_when_the_choice_is_at_the_grids_edge():
    chosen = {
        "top": {"point": "lr=0.4", "scores": {"lr=0.1": 0.80, "lr=0.2": 0.81, "lr=0.4": 0.82}},
        "inside": {"point": "lr=0.2", "scores": {"lr=0.1": 0.80, "lr=0.2": 0.83, "lr=0.4": 0.82}},
        "two-knobs": {"point": "lr=0.1+proximal-mu=0.01",
                      "scores": {"lr=0.1+proximal-mu=0.001": 0.8, "lr=0.1+proximal-mu=0.01": 0.81,
                                 "lr=0.2+proximal-mu=0.001": 0.7, "lr=0.2+proximal-mu=0.01": 0.7}},
        "one-value": {"point": "lr=0.1", "scores": {"lr=0.1": 0.8}},
    }
    rows = tuning_markdown(chosen, {}).splitlines()[2:]
    assert rows[0].startswith("| top | lr=0.4 (lr at the largest tried) |")
    assert rows[1].startswith("| inside | lr=0.2 |")
    assert rows[2].startswith("| two-knobs | lr=0.1+proximal-mu=0.01 (lr at the smallest tried; "
                              "proximal-mu at the largest tried) |")
    assert rows[3].startswith("| one-value | lr=0.1 |")
