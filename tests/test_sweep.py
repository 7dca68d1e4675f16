"""Tests for simulation.sweep: sweep files, run plans, resume detection and the summary.

No real run is started: run directories are written by hand (``rounds.jsonl``, an empty
``final_model.pt``, real checkpoints of the run's strategy by fedapp.checkpoint), and
``run_app`` is replaced where ``execute`` is exercised.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from fedapp.checkpoint import make_payload, save_checkpoint
from fedapp.config import RunConfig
from fedapp.registry import build_strategy
from simulation import sweep
from simulation.protocol import variant_config
from simulation.tuning import tuning_config, tuning_runs
from simulation.experiments import EXPERIMENTS_DIR, sweep_files

SHIPPED = EXPERIMENTS_DIR / "fedprox_stragglers.toml"


@pytest.fixture(autouse=True)
def known_commit(monkeypatch):
    """The sweep asks git for the code's state before each run (a process): fixed here."""
    monkeypatch.setattr(sweep, "git_state", lambda: {"git-commit": "abc", "git-dirty": False})

SWEEP_TOML = """
title = "tiny sweep"
claim = "b beats a"
seeds = [1, 2]
num-supernodes = 4

[base]
num-server-rounds = 3
lr = 0.1
strategy = "fedavg"
local-epochs = 2

[variants.a]
lr = 0.2

[variants."b.x"]
strategy = "fedprox"
proximal-mu = 0.01
seed = 99
output-dir = "/nowhere"
"""


def write(tmp_path: Path, text: str, name: str = "s.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def fake_run_dir(
    directory: Path,
    accuracies: list[float],
    model: bool = True,
    name: str = "20250101-000000-x-run1",
) -> Path:
    run = directory / name
    run.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps({"round": i, "accuracy": a, "loss": 1.0 - a}) for i, a in enumerate(accuracies)
    ]
    (run / "rounds.jsonl").write_text("\n".join(lines) + "\n")
    if model:
        (run / "final_model.pt").write_bytes(b"")
    return run


def write_checkpoint(run_dir: Path, run_config: dict, server_round: int = 2) -> Path:
    """A real checkpoint in ``run_dir``, as the ServerApp of ``run_config`` writes it."""
    cfg = RunConfig.from_user_config(run_config)
    strategy, _ = build_strategy(cfg)
    arrays = ArrayRecord({"w": Array(np.zeros(3, np.float32))})
    return save_checkpoint(run_dir, make_payload(server_round, arrays, strategy, [], 1.0,
                                                 cfg.to_dict()))


# ---------------------------------------------------------------- load / plan
def test_plan_variants_times_seeds_merge_order(tmp_path):
    spec = sweep.load_sweep(write(tmp_path, SWEEP_TOML))
    out = tmp_path / "out"
    runs = sweep.plan(spec, out)
    assert [(r.variant, r.seed) for r in runs] == [("a", 1), ("a", 2), ("b.x", 1), ("b.x", 2)]
    for run in runs:
        assert run.directory == out / run.variant / f"seed{run.seed}"
        # seed and output-dir are set last: they win over base and variant
        assert run.run_config["seed"] == run.seed
        assert run.run_config["output-dir"] == str(
            (out / run.variant / f"seed{run.seed}").resolve()
        )
        assert Path(run.run_config["output-dir"]).is_absolute()
        assert run.run_config["num-server-rounds"] == 3 and run.run_config["local-epochs"] == 2
    a1, _, b1, _ = runs
    assert a1.run_config["lr"] == 0.2 and a1.run_config["strategy"] == "fedavg"  # variant > base
    assert "proximal-mu" not in a1.run_config
    assert b1.run_config["lr"] == 0.1 and b1.run_config["strategy"] == "fedprox"
    assert b1.run_config["proximal-mu"] == 0.01
    # every run's config is its own dict, and the spec is untouched
    runs[0].run_config["lr"] = 123.0
    assert runs[1].run_config["lr"] == 0.2 and spec["base"]["lr"] == 0.1
    assert spec["variants"]["b.x"]["seed"] == 99
    for run in runs:
        RunConfig.from_user_config(run.run_config)


def test_unquoted_dotted_variant_name_says_to_quote(tmp_path):
    text = 'seeds = [0]\n[base]\nlr = 0.1\n[variants.fedprox-mu0.01]\nstrategy = "fedprox"\n'
    with pytest.raises(ValueError) as info:
        sweep.load_sweep(write(tmp_path, text))
    message = str(info.value)
    assert "quote" in message
    assert '[variants."fedprox-mu0.01"]' in message


def test_quoted_dotted_variant_name_loads(tmp_path):
    text = 'seeds = [0]\n[variants."fedprox-mu0.01"]\nstrategy = "fedprox"\n'
    spec = sweep.load_sweep(write(tmp_path, text))
    runs = sweep.plan(spec, tmp_path / "out")
    assert [r.variant for r in runs] == ["fedprox-mu0.01"]
    assert runs[0].directory == tmp_path / "out" / "fedprox-mu0.01" / "seed0"
    assert runs[0].run_config["strategy"] == "fedprox"  # no [base]: just the variant


def test_plan_restricted_to_some_seeds_keeps_file_order(tmp_path):
    text = "seeds = [0, 1]\n[variants.a]\nlr = 0.1\n[variants.b]\nseeds = [1, 2]\n"
    spec = sweep.load_sweep(write(tmp_path, text))
    assert [(r.variant, r.seed) for r in sweep.plan(spec, tmp_path / "out")] == [
        ("a", 0),
        ("a", 1),
        ("b", 1),
        ("b", 2),
    ]
    assert [(r.variant, r.seed) for r in sweep.plan(spec, tmp_path / "out", seeds=[1])] == [
        ("a", 1),
        ("b", 1),
    ]


@pytest.mark.parametrize("missing", ["variants", "seeds"])
def test_missing_section_raises(tmp_path, missing):
    text = (
        SWEEP_TOML.replace("seeds = [1, 2]", "")
        if missing == "seeds"
        else "seeds = [0]\n[base]\nlr = 0.1\n"
    )
    with pytest.raises(ValueError, match=missing):
        sweep.load_sweep(write(tmp_path, text))


def test_shipped_fedprox_stragglers_sweep_plans_12_valid_runs(tmp_path):
    spec = sweep.load_sweep(SHIPPED)
    runs = sweep.plan(spec, tmp_path / "out")
    assert len(runs) == 12
    assert len({r.directory for r in runs}) == 12
    expected = {
        "fedavg-drop": ("fedavg", "drop"),
        "fedprox-mu0.01": ("fedprox", "partial"),
        "fedprox-mu0.1": ("fedprox", "partial"),
        "fednova": ("fednova", "partial"),
    }
    assert {r.variant for r in runs} == set(expected)
    for run in runs:
        cfg = RunConfig.from_user_config(run.run_config)
        assert (cfg.strategy, cfg.straggler_policy) == expected[run.variant]
        assert cfg.seed == run.seed and cfg.seed in (0, 1, 2)
        assert cfg.straggler_fraction == 0.5 and cfg.num_server_rounds == 20
        assert cfg.output_dir == str(run.directory.resolve())
    mus = {r.variant: RunConfig.from_user_config(r.run_config).proximal_mu for r in runs}
    assert mus["fedprox-mu0.01"] == 0.01 and mus["fedprox-mu0.1"] == 0.1


# ---------------------------------------------------------------- finished runs
def plan_tiny(tmp_path):
    return sweep.plan(sweep.load_sweep(write(tmp_path, SWEEP_TOML)), tmp_path / "out")


def test_finished_run_dir_complete(tmp_path):
    run = plan_tiny(tmp_path)[0]  # num-server-rounds = 3: rounds 0..3
    complete = fake_run_dir(run.directory, [0.1, 0.2, 0.3, 0.4])
    assert sweep.finished_run_dir(run) == complete


@pytest.mark.parametrize(
    "accuracies, model",
    [
        ([0.1, 0.2, 0.3], True),  # one round short
        ([0.1, 0.2, 0.3, 0.4], False),  # no final model
        ([0.1], True),
    ],
)
def test_finished_run_dir_ignores_incomplete(tmp_path, accuracies, model):
    run = plan_tiny(tmp_path)[0]
    fake_run_dir(run.directory, accuracies, model=model)
    assert sweep.finished_run_dir(run) is None


def test_finished_run_dir_missing_and_mixed(tmp_path):
    run = plan_tiny(tmp_path)[1]
    assert sweep.finished_run_dir(run) is None  # nothing there yet
    fake_run_dir(run.directory, [0.1, 0.2], name="20250101-000000-a-run1")  # interrupted attempt
    done = fake_run_dir(run.directory, [0.1, 0.2, 0.3, 0.4], name="20250102-000000-a-run2")
    assert sweep.finished_run_dir(run) == done


def test_finished_run_dir_default_rounds_is_10(tmp_path):
    spec = sweep.load_sweep(write(tmp_path, "seeds = [0]\n[variants.v]\nlr = 0.1\n"))
    run = sweep.plan(spec, tmp_path / "out")[0]
    fake_run_dir(run.directory, [0.5] * 10)
    assert sweep.finished_run_dir(run) is None
    fake_run_dir(run.directory, [0.5] * 11, name="20250101-000001-x-run2")
    assert sweep.finished_run_dir(run) is not None


# ---------------------------------------------------------------- summary
def test_summarize_and_write_summary_hand_computed(tmp_path):
    runs = plan_tiny(tmp_path)
    a1, a2, b1, _ = runs
    # a: finals 0.4, 0.7 -> mean 0.55, std sqrt((0.15^2 + 0.15^2) / 1) = 0.212132
    #    bests  0.5, 0.7 -> mean 0.6,  std sqrt((0.1^2 + 0.1^2) / 1)   = 0.141421
    # b: one seed, final 0.3, best 0.35 -> std 0
    done = [
        (a1, fake_run_dir(a1.directory, [0.1, 0.5, 0.45, 0.4])),
        (a2, fake_run_dir(a2.directory, [0.1, 0.6, 0.65, 0.7])),
        (b1, fake_run_dir(b1.directory, [0.1, 0.35, 0.2, 0.3])),
    ]
    rows = sweep.summarize(done)
    assert [r["variant"] for r in rows] == ["a", "b.x"]
    a, b = rows
    assert a["seeds"] == 2 and b["seeds"] == 1
    assert a["final-mean"] == pytest.approx(0.55) and a["final-std"] == pytest.approx(
        0.15 * math.sqrt(2)
    )
    assert a["best-mean"] == pytest.approx(0.6) and a["best-std"] == pytest.approx(
        0.1 * math.sqrt(2)
    )
    assert b["final-mean"] == pytest.approx(0.3) and b["final-std"] == 0.0
    assert b["best-mean"] == pytest.approx(0.35) and b["best-std"] == 0.0

    out = tmp_path / "out"
    table = sweep.write_summary(rows, out, {"title": "tiny sweep", "claim": "b beats a"})
    assert "| a | 2 | 55.00 ± 21.21 | 60.00 ± 14.14 |" in table
    assert "| b.x | 1 | 30.00 | 35.00 |" in table
    md = (out / "summary.md").read_text()
    assert md.startswith("# tiny sweep\n") and "b beats a" in md and table in md
    with (out / "summary.csv").open() as handle:
        got = list(csv.DictReader(handle))
    assert [r["variant"] for r in got] == ["a", "b.x"]
    assert set(got[0]) == {"variant", "seeds", "final-mean", "final-std", "best-mean", "best-std"}
    assert float(got[0]["final-mean"]) == pytest.approx(0.55)
    assert float(got[0]["final-std"]) == pytest.approx(0.212132, abs=1e-6)
    assert float(got[1]["best-mean"]) == pytest.approx(0.35) and int(got[1]["seeds"]) == 1


def test_write_summary_empty(tmp_path):
    table = sweep.write_summary([], tmp_path, {})
    assert table.splitlines()[0].startswith("| variant |")
    assert (tmp_path / "summary.csv").read_text().strip() == "variant"
    assert (tmp_path / "summary.md").read_text().startswith("# sweep")


# ---------------------------------------------------------------- execute (run_app faked)
def test_execute_skips_finished_and_runs_the_rest(tmp_path, monkeypatch, capsys):
    spec = sweep.load_sweep(write(tmp_path, SWEEP_TOML))
    out = tmp_path / "out"
    runs = sweep.plan(spec, out)
    fake_run_dir(runs[0].directory, [0.1, 0.2, 0.3, 0.4])  # already finished
    calls = []

    def fake_run_app(run_config, federation, **kwargs):
        calls.append((run_config["seed"], run_config["output-dir"], federation))
        directory = Path(run_config["output-dir"])
        if "b.x" in directory.parts and run_config["seed"] == 2:  # this run crashes
            return SimpleNamespace(returncode=1, status="crashed", output="boom")
        fake_run_dir(directory, [0.1, 0.2, 0.3, 0.5])
        return SimpleNamespace(returncode=0, status="ok", output="")

    monkeypatch.setattr(sweep, "run_app", fake_run_app)
    done = sweep.execute(spec, out)
    assert [(r.variant, r.seed) for r, _ in done] == [("a", 1), ("a", 2), ("b.x", 1)]
    assert [(seed, Path(d).parts[-2:]) for seed, d, _ in calls] == [
        (2, ("a", "seed2")),
        (1, ("b.x", "seed1")),
        (2, ("b.x", "seed2")),
    ]
    assert calls[0][2]["num-supernodes"] == 4
    printed = capsys.readouterr().out
    assert "already done" in printed and "FAILED" in printed
    # a second pass runs only the failed one
    calls.clear()
    sweep.execute(spec, out)
    assert [(seed, Path(d).parts[-2:]) for seed, d, _ in calls] == [(2, ("b.x", "seed2"))]


def test_a_variant_may_name_its_own_seeds(tmp_path):
    from simulation.sweep import plan

    spec = {"seeds": [0, 1, 2], "variants": {"a": {"lr": 0.1}, "b": {"lr": 0.03, "seeds": [0]}}}
    runs = plan(spec, tmp_path)
    assert [(r.variant, r.seed) for r in runs] == [("a", 0), ("a", 1), ("a", 2), ("b", 0)]
    assert "seeds" not in runs[-1].run_config


@pytest.mark.parametrize("path", sweep_files(), ids=lambda p: p.stem)
def test_every_shipped_experiment_is_a_valid_sweep(path, tmp_path):
    spec = sweep.load_sweep(path)
    for key in ("title", "claim", "runtime", "targets"):
        assert spec.get(key), f"{path.name}: no '{key}'"
    configs = [run.run_config for run in sweep.plan(spec, tmp_path)]
    if "tuning" in spec:  # every tuning run, and the seeds at each point they may be tuned to
        for t in tuning_runs(spec, tmp_path):
            configs.append(tuning_config(variant_config(spec, t.variant), t,
                                         spec["tuning"]["seed"]))
            configs += [run.run_config for run in sweep.plan(
                spec, tmp_path, variants=[t.variant], chosen={t.variant: {"values": t.values}})]
    assert configs
    for config in configs:
        RunConfig.from_user_config(config)  # raises ConfigError naming the bad key
    for prefix, baseline in spec.get("baselines", {}).items():
        assert baseline.startswith(prefix) and baseline in spec["variants"], (
            path.name,
            prefix,
            baseline,
        )


def test_the_shipped_sweep_files_are_found():
    assert len(sweep_files()) >= 9 and SHIPPED in sweep_files()


# ---------------------------------------------------------------- variants filter, resume
def test_plan_variants_patterns_select_in_file_order(tmp_path):
    spec = {"seeds": [0], "variants": {"dir0.5-fedavg": {}, "c2-fedavg": {}, "dir0.5-moon": {},
                                       "iid-fedavg": {}}}
    runs = sweep.plan(spec, tmp_path, variants=["dir0.5-*", "iid-fedavg"])
    assert [r.variant for r in runs] == ["dir0.5-fedavg", "dir0.5-moon", "iid-fedavg"]
    assert sweep.plan(spec, tmp_path, variants=["nothing*"]) == []


def test_resumable_run_dir_is_the_newest_unfinished_checkpoint(tmp_path):
    run = plan_tiny(tmp_path)[0]
    assert sweep.resumable_run_dir(run) is None
    old = fake_run_dir(run.directory, [0.1, 0.2], model=False, name="20250101-000000-x-run1")
    write_checkpoint(old, run.run_config, 1)
    new = fake_run_dir(run.directory, [0.1, 0.2, 0.3], model=False, name="20250102-000000-x-run2")
    write_checkpoint(new, run.run_config, 2)
    assert sweep.resumable_run_dir(run) == new
    done = fake_run_dir(run.directory, [0.1, 0.2, 0.3, 0.4], name="20250103-000000-x-run3")
    write_checkpoint(done, run.run_config, 3)  # a finished run is not resumed
    assert sweep.resumable_run_dir(run) == new


def test_execute_resumes_a_stopped_run_from_its_checkpoint(tmp_path, monkeypatch):
    spec = sweep.load_sweep(write(tmp_path, SWEEP_TOML))
    out = tmp_path / "out"
    first = sweep.plan(spec, out)[0]
    partial = fake_run_dir(first.directory, [0.1, 0.2], model=False)
    write_checkpoint(partial, first.run_config)
    configs = []

    def fake_run_app(run_config, federation, **kwargs):
        configs.append(run_config)
        fake_run_dir(Path(run_config["output-dir"]), [0.1, 0.2, 0.3, 0.4], name="20990101-run")
        return SimpleNamespace(returncode=0, status="ok", output="")

    monkeypatch.setattr(sweep, "run_app", fake_run_app)
    done = sweep.execute(spec, out, variants=["a"])
    assert [(r.variant, r.seed) for r, _ in done] == [("a", 1), ("a", 2)]
    assert configs[0]["resume-from"] == str(partial.resolve())
    assert "resume-from" not in configs[1] and "resume-from" not in first.run_config


def test_an_unknown_top_level_key_is_an_error_with_a_hint(tmp_path):
    text = "seeds = [0]\nnum_supernodes = 20\nlr = 0.1\n[variants.a]\n"
    with pytest.raises(ValueError) as info:
        sweep.load_sweep(write(tmp_path, text))
    message = str(info.value)
    assert ("unknown top-level key(s) 'num_supernodes' (did you mean 'num-supernodes'?), "
            "'lr'") in message
    assert "run-config keys go in [base] or a variant" in message


def test_every_shipped_sweep_file_loads():
    from simulation.experiments import EXPERIMENTS_DIR

    files = sorted(EXPERIMENTS_DIR.glob("*.toml"))
    assert len(files) >= 10
    for path in files:
        sweep.load_sweep(path)


@pytest.mark.parametrize("argv, says", [
    (["--seeds", "99"], "--seeds 99 selects no run"),
    (["--variants", "nope*"], "--variants nope* selects no run"),
    (["--seeds", "1", "--variants", "b"], "--seeds 1 --variants b selects no run"),
])
def test_filters_that_select_no_run_say_what_the_file_has(tmp_path, argv, says):
    from simulation import __main__ as simulation_cli

    path = write(tmp_path, "seeds = [0, 1]\n[variants.a]\nlr = 0.1\n[variants.b]\nseeds = [2]\n")
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as info:
        simulation_cli.main(["sweep", str(path), "--out", str(out), *argv])
    assert str(info.value) == (f"{path}: {says}; the file has the variants a, b and the "
                               "seeds 0, 1, 2")
    assert not out.exists()  # nothing written for a run that did not happen


# ---------------------------------------------------------------- what a sweep resumes
def test_a_checkpoint_of_another_variant_or_seed_is_not_resumed(tmp_path, capsys):
    a1, a2, b1, _ = plan_tiny(tmp_path)
    # the checkpoints of seed 2 and of variant b.x, planted in a/seed1's folder
    other_seed = fake_run_dir(a1.directory, [0.1], model=False, name="20250101-000000-x-run1")
    write_checkpoint(other_seed, a2.run_config)
    other_variant = fake_run_dir(a1.directory, [0.1], model=False, name="20250102-000000-x-run2")
    write_checkpoint(other_variant, b1.run_config)
    assert sweep.resumable_run_dir(a1) is None
    printed = capsys.readouterr().out
    assert printed.count("not resuming") == 2 and "written with another run config" in printed
    assert str(other_seed) in printed and str(other_variant) in printed
    own = fake_run_dir(a1.directory, [0.1], model=False, name="20250103-000000-x-run3")
    write_checkpoint(own, a1.run_config)
    assert sweep.resumable_run_dir(a1) == own


def test_a_pickle_checkpoint_is_passed_over_unread(tmp_path, capsys):
    """An old checkpoint.pkl (or a planted one) is never unpickled: the sweep says why and
    starts afresh; the file's payload, which would create a file when unpickled, never runs."""
    import pickle  # noqa: PLC0415 - to write the planted file only

    class Planted:
        def __reduce__(self):
            return (Path.touch, (tmp_path / "pwned",))

    run = plan_tiny(tmp_path)[0]
    old = fake_run_dir(run.directory, [0.1, 0.2], model=False)
    (old / "checkpoint.pkl").write_bytes(pickle.dumps(Planted()))
    assert sweep.resumable_run_dir(run) is None
    printed = capsys.readouterr().out
    assert "checkpoint.pkl" in printed and "can run any code" in printed
    assert not (tmp_path / "pwned").exists()


def test_a_damaged_checkpoint_is_passed_over_with_the_reason(tmp_path, capsys):
    run = plan_tiny(tmp_path)[0]
    old = fake_run_dir(run.directory, [0.1, 0.2], model=False)
    path = write_checkpoint(old, run.run_config)
    text = path.read_text()
    assert '["round",2]' in text  # in the hashed state
    path.write_text(text.replace('["round",2]', '["round",3]'))
    assert sweep.resumable_run_dir(run) is None
    assert "SHA-256" in capsys.readouterr().out


# ---------------------------------------------------------------- variant names, run logs
@pytest.mark.parametrize("name", ["../../../../escaped", "a/b", ".hidden", "..", "nul\x00x",
                                  "", "back\\slash"])
def test_an_unsafe_variant_name_is_refused(tmp_path, name):
    spec = {"seeds": [0], "variants": {name: {"lr": 0.1}}}
    with pytest.raises(ValueError, match="is not a safe folder name"):
        sweep.plan(spec, tmp_path / "out")


def test_a_variant_named_to_escape_writes_nothing_outside_the_sweep_folder(tmp_path):
    from simulation import __main__ as simulation_cli  # noqa: PLC0415

    box = tmp_path / "a" / "b" / "c" / "d"
    box.mkdir(parents=True)
    path = write(box, 'seeds = [0]\n[variants."../../../../escaped"]\nlr = 0.1\n')
    before = sorted(p for p in tmp_path.rglob("*"))
    with pytest.raises(SystemExit, match="'../../../../escaped' is not a safe folder name"):
        simulation_cli.main(["sweep", str(path), "--out", str(box / "out")])
    assert sorted(p for p in tmp_path.rglob("*")) == before
    assert not (tmp_path / "escaped").exists()


def test_a_truncated_last_line_of_rounds_jsonl_is_skipped_with_a_warning(tmp_path):
    run = plan_tiny(tmp_path)[0]
    done = fake_run_dir(run.directory, [0.1, 0.2, 0.3, 0.4])
    with (done / "rounds.jsonl").open("a") as handle:
        handle.write('{"round": 4, "accur')  # a run killed while appending
    with pytest.warns(RuntimeWarning, match=r"rounds.jsonl, line 5: skipped"):
        assert sweep.finished_run_dir(run) == done
    with pytest.warns(RuntimeWarning):
        rows = sweep.summarize([(run, done)])
    assert rows[0]["final-mean"] == pytest.approx(0.4)


def test_a_bad_value_in_a_sweep_file_is_fixed_in_the_sweep_files_syntax(tmp_path):
    from simulation import __main__ as simulation_cli

    path = write(tmp_path, "seeds = [0]\n[variants.a]\nstrategy = 'fedprx'\n")
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as info:
        simulation_cli.main(["sweep", str(path), "--out", str(out)])
    message = str(info.value)
    assert message.startswith("variant 'a', seed 0: run config: strategy='fedprx' is not "
                              "allowed (did you mean 'fedprox'?)")
    assert "Set it with: strategy = 'fedprox' in the variant's table (or [base])" in message
