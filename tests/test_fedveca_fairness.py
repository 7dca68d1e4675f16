"""FedVeca's fairness protocol, the centralized-SGD baseline, fractional local epochs and
the Fig. 3 tables (simulation.experiments.fedveca), against hand-computed numbers."""

from __future__ import annotations

import json
import math

import pytest
import torch

from fedapp.config import ConfigError, RunConfig
from fedapp.registry import build_strategy, train_config
from simulation.experiments.fedveca.centralized import centralized_sgd, even_checkpoints
from simulation.experiments.fedveca.fairness import (baseline_taus, budget, checkpoints, e_avg,
                                                     first_reach, partition_sizes, steps_per_round)
from simulation.experiments.fedveca.plots import build, first_reach_rows
from strategies import contract as C
from strategies.client import local_sgd
from task.models import LinearSVM

SIZES = [10000, 10000, 10000, 12000, 18000]  # FedVeca Case 3 on a 60k training set


def fedveca_records():
    """Round 0 (initial model, no taus) and three rounds of FedVeca with taus by partition id."""
    return [
        {"round": 0, "accuracy": 0.0, "loss": 0.5},
        {
            "round": 1,
            "accuracy": 0.8,
            "loss": 0.2,
            C.LOG_FEDVECA_TAU: {"0": 20, "1": 20, "2": 20, "3": 20, "4": 20},
        },
        {
            "round": 2,
            "accuracy": 0.9,
            "loss": 0.15,
            C.LOG_FEDVECA_TAU: {"0": 20, "1": 20, "2": 20, "3": 20, "4": 20},
        },
        {
            "round": 3,
            "accuracy": 0.92,
            "loss": 0.1,
            C.LOG_FEDVECA_TAU: {"0": 2, "1": 3, "2": 2, "3": 14, "4": 7},
        },
    ]


# ----------------------------------------------------------------- E_avg and the baselines' taus
def test_steps_per_round_sums_the_clients_taus():
    assert steps_per_round(fedveca_records()) == [100, 100, 28]
    shuffled = list(reversed(fedveca_records()))
    assert steps_per_round(shuffled) == [100, 100, 28]


def test_budget_against_hand_computed_numbers():
    plan = budget(fedveca_records(), SIZES, batch_size=100)
    assert plan.rounds == 3
    assert plan.tau_all == 228
    # E_avg = (tau_all / K) * B / D = (228 / 3) * 100 / 60000 = 0.12666...
    assert plan.e_avg == pytest.approx(228 * 100 / (3 * 60000))
    # tau_i = floor(E_avg D_i / B): 12.67 -> 12 (x3), 15.2 -> 15, 22.8 -> 22
    assert plan.baseline_taus == [12, 12, 12, 15, 22]
    assert plan.baseline_steps_per_round == 73  # <= 228 / 3 = 76 (the floors)
    info = plan.to_json()
    assert info["total-examples"] == 60000 and info[
        "fedveca-steps-per-round-mean"
    ] == pytest.approx(76.0)
    json.dumps(info)


def test_e_avg_formula_and_errors():
    assert e_avg(250, 50, 100, 60000) == pytest.approx(1 / 120)
    with pytest.raises(ValueError):
        e_avg(10, 0, 100, 60000)


def test_budget_needs_fedveca_taus():
    with pytest.raises(ValueError, match=C.LOG_FEDVECA_TAU):
        budget([{"round": 0, "accuracy": 0.1}], SIZES, 100)


def test_baseline_taus_take_at_least_one_step():
    # E_avg so small that floor(E D_i / B) = 0: every client still takes one step
    assert baseline_taus([50, 5000], 100, 0.01) == [1, 1]


def test_checkpoints_are_cumulative_steps():
    assert checkpoints([100, 100, 28]) == [100, 200, 228]
    assert even_checkpoints(10, 3) == [3, 7, 10]
    assert even_checkpoints(228, 3)[-1] == 228


def test_partition_sizes_from_label_counts(tmp_path):
    assert partition_sizes(tmp_path) is None
    (tmp_path / "partitions.json").write_text(json.dumps({"1": [3, 4], "0": [1, 2], "10": [5, 5]}))
    assert partition_sizes(tmp_path) == [3, 7, 10]


# ----------------------------------------------------------------- fractional local epochs
@pytest.mark.parametrize(
    "n, b, e, expected",
    [
        (12000, 100, 0.25, 30),
        (10000, 100, 0.12666666666666668, 12),
        (18000, 100, 0.12666666666666668, 22),
        (100, 1, 0.57, 57),  # a naive float floor gives 56 (0.57 * 100 = 56.99999999999999)
        (100, 1, 0.29, 29),  # naive: 28
        (10, 3, 0.5, 1),
        (10, 3, 0.01, 1),
        (10, 0, 0.5, 1),
        (10, 20, 2.5, 2),
        (10, 3, 2.0, 6),
        (0, 3, 0.5, 0),
        (10, 3, 0.0, 0),
    ],
)
def test_fractional_epochs(n, b, e, expected):
    assert C.steps_for_epochs(n, b, e) == expected


def test_local_sgd_runs_a_fraction_of_an_epoch():
    x, y = torch.rand(50, 1, 2, 2), torch.randint(0, 2, (50,))
    result = local_sgd(
        LinearSVM((1, 2, 2)), x, y, lr=0.01, batch_size=10, epochs=0.45, seed=0
    )
    assert result.local_steps == 2  # floor(0.45 * 50 / 10) = floor(2.25)


def test_config_accepts_fractional_local_epochs():
    cfg = RunConfig.from_user_config(
        {"strategy": "fednova", "local-epochs": 0.12666666666666668, "batch-size": 100}
    )
    strategy, config = build_strategy(cfg)
    assert config[C.LOCAL_EPOCHS] == 0.12666666666666668
    whole = train_config(RunConfig.from_user_config({"local-epochs": 3.0}))
    assert whole[C.LOCAL_EPOCHS] == 3 and type(whole[C.LOCAL_EPOCHS]) is int
    for bad in (0.0, -0.5, math.inf):
        with pytest.raises(ConfigError, match="local-epochs"):
            RunConfig.from_user_config({"local-epochs": bad})


def test_fedavg_full_local_steps_with_a_fraction():
    from flwr.app import ConfigRecord  # noqa: PLC0415

    from strategies.engine.records import ClientInfo  # noqa: PLC0415

    strategy, _ = build_strategy(RunConfig.from_user_config({"strategy": "fedavg"}))
    strategy.participation.clients[7] = ClientInfo(num_examples=18000)
    config = ConfigRecord({C.LOCAL_EPOCHS: 0.12666666666666668, C.BATCH_SIZE: 100})
    assert strategy.work.full_local_steps(7, config) == 22


# ----------------------------------------------------------------- centralized SGD
def test_centralized_sgd_takes_exactly_the_budgeted_steps():
    torch.manual_seed(0)
    x, y = torch.rand(37, 1, 2, 2), torch.randint(0, 10, (37,))
    model = LinearSVM((1, 2, 2))
    sizes: list[int] = []
    model.register_forward_hook(lambda module, inputs, output: sizes.append(len(inputs[0])))
    seen = []
    steps = centralized_sgd(
        model,
        x,
        y,
        [3, 5, 5, 9],
        lr=0.1,
        batch_size=8,
        seed=1,
        on_checkpoint=lambda k, s, loss: seen.append((k, s, math.isnan(loss))),
    )
    assert steps == 9
    assert sizes == [8] * 9  # B examples per step
    assert seen == [
        (1, 3, False),
        (2, 5, False),
        (3, 5, True),
        (4, 9, False),
    ]  # no steps in round 3
    assert model.weight.abs().sum() > 0


def test_centralized_sgd_rejects_decreasing_checkpoints():
    with pytest.raises(ValueError):
        centralized_sgd(
            LinearSVM((1, 2, 2)),
            torch.rand(4, 1, 2, 2),
            torch.zeros(4, dtype=torch.long),
            [5, 3],
            lr=0.1,
            batch_size=2,
            seed=0,
        )


def test_centralized_sgd_is_deterministic_per_seed():
    x, y = torch.rand(40, 1, 2, 2), torch.randint(0, 10, (40,))
    weights = []
    for _ in range(2):
        model = LinearSVM((1, 2, 2))
        centralized_sgd(model, x, y, [4, 10], lr=0.1, batch_size=8, seed=3)
        weights.append(model.weight.detach().clone())
    assert torch.equal(weights[0], weights[1])


# ----------------------------------------------------------------- first reach and the tables
def test_first_reach_round():
    records = [
        {"round": 0, "accuracy": 0.95, "loss": 0.01},
        {"round": 1, "accuracy": 0.5, "loss": 0.4},
        {"round": 2, "accuracy": 0.8, "loss": 0.2},
        {"round": 3, "accuracy": 0.7, "loss": 0.3},
        {"round": 4, "accuracy": 0.9, "loss": 0.1},
    ]
    assert first_reach(records, 0.8) == 2  # reached exactly
    assert first_reach(records, 0.85) == 4  # not the best-so-far curve: round 4 itself
    assert first_reach(records, 0.95) is None  # round 0 does not count
    assert first_reach(records, 0.95, start_round=0) == 0
    assert first_reach(records, 0.2, key="loss", lower_is_better=True) == 2
    assert first_reach(records, 0.05, key="loss", lower_is_better=True) is None


def _fake_run(folder, variant, seed, accuracies, extra=None):
    run = folder / variant / f"seed{seed}" / "20260101-000000-x-run1"
    run.mkdir(parents=True)
    rows = [
        {"round": r, "accuracy": a, "loss": 1 - a, **((extra or {}) if r else {})}
        for r, a in enumerate(accuracies)
    ]
    (run / "rounds.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (run / "final_model.pt").write_bytes(b"")


def test_tables_and_figures_on_fake_runs(tmp_path):
    tau = {
        C.LOG_FEDVECA_TAU: {"0": 20, "1": 3},
        C.LOG_FEDVECA_TAU_K: 11.5,
        C.LOG_FEDVECA_A: {"0": 1e-3, "1": 2e-3},
    }
    for seed, shift in ((0, 0.0), (1, 0.01)):
        _fake_run(tmp_path, "fedveca", seed, [0.0, 0.7 + shift, 0.9, 0.91], tau)
        _fake_run(tmp_path, "fedavg", seed, [0.0, 0.5, 0.85 + shift, 0.9 + shift])
        _fake_run(tmp_path, "centralized", seed, [0.0, 0.8, 0.85, 0.9])
    (tmp_path / "fairness_seed0.json").write_text(
        json.dumps(
            {
                "seed": 0,
                "rounds": 3,
                "tau_all": 69,
                "sizes": [10, 20],
                "e_avg": 0.5,
                "baseline_taus": [1, 2],
                "baseline-steps-per-round": 3,
            }
        )
    )
    text = build(tmp_path, tmp_path / "out")
    rows = {(r["variant"], r["seed"]): r for r in first_reach_rows(_seeds(tmp_path))}
    assert rows[("fedveca", "seed0")]["first-round-accuracy"] == 2  # 0.9 >= 0.9
    assert rows[("fedavg", "seed0")]["first-round-accuracy"] == 3
    assert rows[("fedavg", "seed1")]["first-round-accuracy"] == 3  # 0.91 >= 0.9
    assert rows[("centralized", "seed0")]["first-round-accuracy"] == 3
    assert rows[("fedveca", "seed0")]["first-round-loss"] == 2  # 0.1 <= 0.1
    loose = {
        (r["variant"], r["seed"]): r
        for r in first_reach_rows(_seeds(tmp_path), acc_tolerance=0.1, loss_tolerance=1.0)
    }
    assert loose[("fedavg", "seed0")]["target-accuracy"] == pytest.approx(0.8)
    assert loose[("fedavg", "seed0")]["first-round-accuracy"] == 2  # 0.85 >= 0.8
    assert loose[("fedavg", "seed0")]["target-loss"] == pytest.approx(0.2)  # 0.1 x 2
    assert loose[("fedavg", "seed0")]["first-round-loss"] == 2
    assert "The same with a tolerance" in text
    assert "| FedVeca | 2 | 2 | 2.0 (2/2) |" in text
    assert "| FedAvg | 3 | 3 | 3.0 (2/2) |" in text
    for name in (
        "fig3_loss_accuracy.png",
        "fig6_tau.png",
        "first_reach.md",
        "first_reach.csv",
        "final.md",
        "fairness.md",
        "tables.md",
    ):
        assert (tmp_path / "out" / name).is_file(), name


def _seeds(folder):
    from simulation.experiments.fedveca.plots import by_seed  # noqa: PLC0415
    from simulation.report import collect  # noqa: PLC0415

    return by_seed(collect(folder))


def test_results_rebuilds_the_fig3_panels(tmp_path, capsys):
    from simulation.__main__ import main  # noqa: PLC0415

    runs = tmp_path / "runs" / "fedveca_fig3_svm"
    for variant in ("fedveca", "centralized"):
        extra = {C.LOG_FEDVECA_TAU: {"0": 2, "1": 3}, C.LOG_FEDVECA_A: {"0": 1e-3, "1": 2e-3}}
        _fake_run(runs, variant, 0, [0.0, 0.8, 0.9], extra)
    out = tmp_path / "docs"
    argv = ["results", "fedveca_fig3", "--runs", str(tmp_path / "runs"), "--out", str(out)]
    assert main(argv) == 0
    assert (out / "fedveca_fig3" / "svm" / "tables.md").is_file()
    assert (out / "fedveca_fig3" / "svm" / "fig3_loss_accuracy.png").is_file()
    assert not (out / "fedveca_fig3" / "cnn").exists()  # no runs, nothing built
    assert "fedveca_fig3/svm/tables.md" in capsys.readouterr().out


def test_fig3_through_the_cli_writes_its_options_and_runs_every_seed(tmp_path, monkeypatch):
    """`fedhetero fedveca-fig3` (and `python -m simulation fedveca-fig3`): the CLI puts the
    tool's module into the parsed args, which driver_args.json must leave out."""
    from simulation import cli
    from simulation.experiments.fedveca import fig3

    seeds = []
    monkeypatch.setattr(fig3, "run_seed", lambda args, out, seed, i, n: seeds.append(seed) or True)
    out = tmp_path / "fig3"
    assert cli.main(["fedveca-fig3", "--out", str(out), "--seeds", "3", "4", "--rounds", "7",
                     "--no-report"]) == 0
    assert seeds == [3, 4]
    written = json.loads((out / "driver_args.json").read_text())
    assert written["rounds"] == 7 and written["out"] == str(out) and written["seeds"] == [3, 4]
    assert written["command"] == "fedveca-fig3" and "tool" not in written


@pytest.mark.parametrize("argv", [
    ["fedveca-fig3", "--rounds", "0"],
    ["fedveca-fig3", "--num-clients", "0"],
    ["fedveca-fig3", "--tau-max", "0"],
    ["centralized", "--out", "x", "--steps", "-1"],
    ["centralized", "--out", "x", "--steps", "5", "--batch-size", "0"],
    ["centralized", "--out", "x", "--steps", "5", "--num-partitions", "0"],
])
def test_fig3_and_centralized_refuse_counts_below_one_before_any_work(argv, capsys):
    from simulation import cli

    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    assert f"argument {argv[-2]}: {argv[-1]!r}" in capsys.readouterr().err


def test_centralized_from_a_folder_without_a_run_log_names_what_to_give(tmp_path):
    from simulation import cli

    with pytest.raises(SystemExit) as info:
        cli.main(["centralized", "--from-fedveca", str(tmp_path), "--out", str(tmp_path / "o")])
    assert str(info.value).startswith(f"--from-fedveca {tmp_path}: no rounds.jsonl there; give "
                                      "a FedVeca run directory")


def test_fig3_with_a_gpu_device_or_share_the_clientapps_cannot_have_stops_first(tmp_path,
                                                                               monkeypatch):
    """Ray hides the GPU from a ClientApp that asks for no share, so --device cuda needs
    --gpus-per-client; a share where torch sees no GPU is refused. No folder either way."""
    from simulation import cli
    from simulation.experiments.fedveca import fig3
    from simulation.runtime import federation

    monkeypatch.setattr(fig3, "run_seed", lambda *a: pytest.fail("no run should start"))
    out = tmp_path / "fig3"
    with pytest.raises(SystemExit, match="fedveca-fig3: device='cuda', but the ClientApps ask "
                                         "for no GPU share"):
        cli.main(["fedveca-fig3", "--out", str(out), "--device", "cuda"])
    monkeypatch.setattr(federation, "visible_gpus", lambda: 0)
    with pytest.raises(SystemExit, match="client-resources-num-gpus=0.5: no ClientApp can start"):
        cli.main(["fedveca-fig3", "--out", str(out), "--gpus-per-client", "0.5"])
    assert not out.exists()
