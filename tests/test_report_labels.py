"""A report labels what it compares (#58 item 5): variants by strategy and the keys that tell
them apart, one label-distribution picture per partition setting, the asynchronous "round"
caveat, accuracy in % and simulated time in s or min. Fake run directories, no processes."""

from __future__ import annotations

import json

from fedapp.run_outputs import ACCURACY_AXIS
from simulation.report import build_report_for, collect_paths, markdown, sim_unit, table_rows
from simulation.report_async import caveat, mixes_async, round_axis
from simulation.report_labels import variant_configs, variant_labels
from simulation.report_partitions import partition_groups, write_pictures
from strategies import contract as C

RUN_ID = "8650790631904722155"


def fake_run(parent, name, config, accuracies=(0.1, 0.5, 0.7), sim_seconds=None, clients=None):
    """A finished run directory: config.json, rounds.jsonl (and partitions.json with
    ``clients`` label-count rows)."""
    directory = parent / name
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({
        "run-config": {"dataset": "fashion-mnist", "partition": "dirichlet", "seed": 0,
                       "output-dir": str(parent), **config}, "run-id": int(RUN_ID)}))
    elapsed, records = 0.0, []
    for r, accuracy in enumerate(accuracies):
        record = {"round": r, "accuracy": accuracy, "loss": 1.0}
        if r:
            record.update({C.LOG_BYTES_UP: 10, C.LOG_BYTES_DOWN: 10})
            if sim_seconds is not None:
                elapsed += sim_seconds
                record.update({C.LOG_SIM_SECONDS: sim_seconds, C.LOG_SIM_ELAPSED: elapsed})
        records.append(record)
    (directory / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (directory / "final_model.pt").write_bytes(b"x")
    if clients is not None:
        (directory / "partitions.json").write_text(json.dumps(
            {str(i): row for i, row in enumerate(clients)}))
    return directory


def loose(tmp_path, *configs, **kwargs):
    """Loose run directories (an output-dir), one per config, named as the app names them."""
    return [fake_run(tmp_path / "runs", f"20261129-0718{10 + i:02d}-{c['strategy']}-run{RUN_ID}{i}",
                     c, **kwargs) for i, c in enumerate(configs)]


# ------------------------------------------------------------------------- labels
def test_variants_are_labelled_by_strategy_and_the_key_that_differs(tmp_path):
    paths = loose(tmp_path, {"strategy": "fedavg", "dirichlet-alpha": 0.1},
                  {"strategy": "fedprox", "dirichlet-alpha": 1.0, "proximal-mu": 0.1})
    runs, _ = collect_paths(paths)
    labels = variant_labels(runs)
    # output-dir and seed are equal or never tell experiments apart; proximal-mu is read by
    # fedprox only, so it tells nothing apart here
    assert sorted(labels.values()) == ["fedavg alpha=0.1", "fedprox alpha=1"]
    table = build_report_for(paths, tmp_path / "out", [0.6])
    assert "| fedavg alpha=0.1 | 1 | 70.00 | 70.00 |" in table
    assert "| fedprox alpha=1 | 1 |" in table and RUN_ID not in table
    csv_text = (tmp_path / "out" / "report.csv").read_text()
    assert "label" in csv_text.splitlines()[0] and "fedavg alpha=0.1" in csv_text


def test_a_key_is_shown_only_where_the_strategy_or_the_scheme_reads_it(tmp_path):
    paths = loose(tmp_path, {"strategy": "fedprox", "proximal-mu": 0.1},
                  {"strategy": "fedprox", "proximal-mu": 0.01},
                  {"strategy": "fedavg", "proximal-mu": 0.5},  # fedavg ignores mu
                  {"strategy": "fedavg", "partition": "iid", "dirichlet-alpha": 0.1})
    labels = sorted(variant_labels(collect_paths(paths)[0]).values())
    assert labels == ["fedavg partition=dirichlet", "fedavg partition=iid",
                      "fedprox partition=dirichlet mu=0.01", "fedprox partition=dirichlet mu=0.1"]


def test_a_sweeps_seeds_never_label_its_variants_but_loose_runs_seeds_do(tmp_path):
    sweep = tmp_path / "sweep"
    for variant, alpha in (("dir0.1", 0.1), ("dir1", 1.0)):
        for seed in (0, 1):
            fake_run(sweep / variant / f"seed{seed}", f"run{seed}",
                     {"strategy": "fedavg", "dirichlet-alpha": alpha, "seed": seed})
    runs, _ = collect_paths([sweep])
    assert variant_labels(runs) == {"dir0.1": "fedavg alpha=0.1", "dir1": "fedavg alpha=1"}
    paths = loose(tmp_path, {"strategy": "fedavg", "seed": 0}, {"strategy": "fedavg", "seed": 1})
    assert sorted(variant_labels(collect_paths(paths)[0]).values()) == [
        "fedavg seed=0", "fedavg seed=1"]


def test_runs_left_with_one_label_get_their_start_time_not_their_run_id(tmp_path):
    paths = loose(tmp_path, {"strategy": "fedavg"}, {"strategy": "fedavg"})
    labels = variant_labels(collect_paths(paths)[0])
    assert sorted(labels.values()) == ["fedavg (2026-11-29 07:18:10)",
                                       "fedavg (2026-11-29 07:18:11)"]
    same_second = fake_run(tmp_path / "runs", "20261129-071810-fedavg-run1-2",
                           {"strategy": "fedavg"})  # started in the same second: a number
    labels = variant_labels(collect_paths([*paths, same_second])[0])
    assert sorted(labels.values()) == ["fedavg (2026-11-29 07:18:10)",
                                       "fedavg (2026-11-29 07:18:10) #2",
                                       "fedavg (2026-11-29 07:18:11)"]


def test_a_run_without_config_keeps_its_name(tmp_path):
    run = fake_run(tmp_path, "plain", {"strategy": "fedavg"})
    (run / "config.json").unlink()
    assert variant_labels(collect_paths([run])[0]) == {"plain": "plain"}


# -------------------------------------------------------------- partition settings
def test_runs_with_different_dirichlet_alpha_get_one_picture_each(tmp_path):
    counts = [[5, 0, 1], [0, 7, 2]]
    paths = loose(tmp_path, {"strategy": "fedavg", "dirichlet-alpha": 0.1},
                  {"strategy": "fedprox", "dirichlet-alpha": 0.1},
                  {"strategy": "fedavg", "dirichlet-alpha": 1.0}, clients=counts)
    runs, _ = collect_paths(paths)
    groups = partition_groups(runs)
    assert list(groups) == [
        "fashion-mnist, dirichlet alpha=0.1 min-partition-size=10, 2 clients, partition seed 0",
        "fashion-mnist, dirichlet alpha=1 min-partition-size=10, 2 clients, partition seed 0"]
    assert [len(members) for members in groups.values()] == [2, 1]
    labels = variant_labels(runs)
    table = write_pictures(runs, labels, tmp_path)
    pictures = sorted(p.name for p in tmp_path.glob("label_distribution_*.png"))
    assert len(pictures) == 2 and all("alpha-0.1" in p or "alpha-1" in p for p in pictures)
    assert "| fedavg alpha=0.1, fedprox alpha=0.1 |" in table


def test_the_partition_seed_and_the_number_of_clients_make_a_setting(tmp_path):
    paths = loose(tmp_path, {"strategy": "fedavg", "seed": 0}, {"strategy": "fedavg", "seed": 1},
                  {"strategy": "fedprox", "seed": 2, "partition-seed": 0})
    more = fake_run(tmp_path / "more", "r", {"strategy": "fedavg"}, clients=[[1], [2], [3]])
    groups = partition_groups(collect_paths([*paths, more])[0])
    settings = list(groups)
    assert [s.rsplit(", ", 1)[1] for s in settings] == ["partition seed 0", "partition seed 1",
                                                        "partition seed 0"]
    assert [d.name for _, d in groups[settings[0]]] == [paths[0].name, paths[2].name]
    assert "3 clients" in settings[2] and "clients" not in settings[0]


# ------------------------------------------------------------ asynchronous rounds
def test_a_sync_and_async_mix_says_an_async_round_is_a_server_update(tmp_path):
    paths = loose(tmp_path, {"strategy": "fedavg"},
                  {"strategy": "fedbuff", "fedbuff-buffer-size": 5},
                  {"strategy": "fedasync", "fedasync-updates-per-round": 8}, sim_seconds=30.0)
    runs, _ = collect_paths(paths)
    configs = variant_configs(runs)
    assert mixes_async(configs)
    note = caveat(configs, clock=True)
    assert "one server update" in note and "K=5" in note and "8 client updates" in note
    assert "simulated time" in note
    xlabel, title = round_axis(configs)
    assert "server update" in xlabel and "server update" in title
    table = build_report_for(paths, tmp_path / "out", [0.6])
    assert table.startswith("† Asynchronous and synchronous")
    assert "| rounds† to 60% |" in table.splitlines()[2]


def test_no_caveat_without_a_mix(tmp_path):
    paths = loose(tmp_path, {"strategy": "fedavg"}, {"strategy": "fedprox"})
    configs = variant_configs(collect_paths(paths)[0])
    assert not mixes_async(configs) and caveat(configs, clock=True) == ""
    assert round_axis(configs) == ("round", "")
    table = build_report_for(paths, tmp_path / "out", [0.6])
    assert "†" not in table


# --------------------------------------------------------------------------- units
def test_accuracy_is_in_percent_in_tables_and_on_every_plot_axis():
    import fedapp.run_plots as run_plots
    import simulation.report as report

    assert ACCURACY_AXIS == "test accuracy (%)"
    assert report.ACCURACY_AXIS is ACCURACY_AXIS and run_plots.ACCURACY_AXIS is ACCURACY_AXIS
    rows = [{"variant": "v", "label": "fedavg", "seeds": 1, "final-mean": 0.785,
             "final-std": 0.0, "best-mean": 0.8, "best-std": 0.0, "rounds-to-0.6": 2.0,
             "MB-to-0.6": 1.0, "reached-0.6": "1/1"}]
    lines = markdown(rows, [0.6]).splitlines()
    assert "final accuracy (%)" in lines[0] and "rounds to 60% |" in lines[0]
    assert lines[2].startswith("| fedavg | 1 | 78.50 | 80.00 |")


def test_simulated_time_is_in_seconds_or_minutes_by_its_magnitude(tmp_path):
    short = loose(tmp_path / "a", {"strategy": "fedavg"}, sim_seconds=2.5)  # 5 s in all
    runs, _ = collect_paths(short)
    assert sim_unit(runs) == (1.0, "s")
    table = build_report_for(short, tmp_path / "out-a", [0.6])
    assert "simulated time per run (s)" in table and "| fedavg | 5 |" in table
    assert "sim s to 60%" in table and "hour" not in table
    long = loose(tmp_path / "b", {"strategy": "fedavg"}, sim_seconds=150.0)  # 300 s in all
    runs, _ = collect_paths(long)
    assert sim_unit(runs) == (60.0, "min")
    rows = table_rows(runs, [0.6])
    assert rows[0]["sim-seconds-total"] == 300.0  # report.csv keeps seconds
    table = build_report_for(long, tmp_path / "out-b", [0.6])
    assert "simulated time per run (min)" in table and "| fedavg | 5 | 2.5 |" in table
    assert "sim min to 60%" in table
