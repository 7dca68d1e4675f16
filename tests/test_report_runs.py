"""``python -m simulation report`` on run directories, folders of runs and sweep folders mixed,
and a sweep folder's kept sweep file (title, targets)."""

from __future__ import annotations

import json

import pytest

from simulation.__main__ import main
from simulation.report import SWEEP_COPY, build_report_for, collect_paths
from strategies import contract as C


def run_dir(parent, name, accuracies, finished=True):
    directory = parent / name
    directory.mkdir(parents=True)
    records = [{"round": r, "accuracy": a, "loss": 1.0 - a,
                **({C.LOG_BYTES_UP: 10, C.LOG_BYTES_DOWN: 10} if r else {})}
               for r, a in enumerate(accuracies)]
    (directory / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if finished:
        (directory / "final_model.pt").write_bytes(b"x")
    return directory


def sweep_folder(tmp_path, name="sweep", spec=""):
    folder = tmp_path / name
    run_dir(folder / "a" / "seed0", "20260101-a-0", [0.1, 0.5, 0.7])
    run_dir(folder / "a" / "seed1", "20260101-a-1", [0.1, 0.3, 0.5])
    run_dir(folder / "b" / "seed0", "20260101-b-0", [0.1, 0.8, 0.6])
    if spec:
        (folder / SWEEP_COPY).write_text(spec)
    return folder


def test_one_run_directory_is_reported_into_its_report_folder(tmp_path, capsys):
    run = run_dir(tmp_path, "20260101-000000-fedavg-run1", [0.1, 0.65, 0.8])
    assert main(["report", str(run), "--target", "0.6"]) == 0
    table = capsys.readouterr().out
    assert "| 20260101-000000-fedavg-run1 | 1 | 80.00 | 80.00 |" in table
    for name in ("report.md", "report.csv", "accuracy_vs_round.png", "accuracy_vs_bytes.png"):
        assert (run / "report" / name).stat().st_size > 0, name


def test_sweep_folders_run_directories_and_folders_of_runs_mix(tmp_path):
    sweep = sweep_folder(tmp_path)
    other = sweep_folder(tmp_path, "other")
    single = run_dir(tmp_path / "runs", "20260102-fedprox-run3", [0.2, 0.9])
    run_dir(tmp_path / "runs", "20260103-fedavg-run4", [0.2, 0.4])
    runs, _ = collect_paths([sweep, other, tmp_path / "runs", single])
    assert sorted(runs) == ["20260102-fedprox-run3", "20260103-fedavg-run4", "other/a",
                            "other/b", "sweep/a", "sweep/b"]
    assert len(runs["sweep/a"]) == 2 and len(runs["20260102-fedprox-run3"]) == 1  # named twice
    runs, _ = collect_paths([sweep, single])  # one sweep folder: its variants keep their names
    assert sorted(runs) == ["20260102-fedprox-run3", "a", "b"]


def test_a_sweep_run_named_by_its_directory_joins_its_variant(tmp_path):
    sweep = sweep_folder(tmp_path)
    runs, _ = collect_paths([*sorted((sweep / "a").glob("seed*/*"))])
    assert list(runs) == ["a"] and len(runs["a"]) == 2


def test_an_unfinished_run_is_reported_up_to_its_last_evaluated_round(tmp_path, capsys):
    run = run_dir(tmp_path, "r", [0.1, 0.4, 0.6], finished=False)
    with (run / "rounds.jsonl").open("a") as handle:
        handle.write(json.dumps({"round": 3, C.LOG_BYTES_UP: 10}) + "\n")
    runs, _ = collect_paths([run])
    assert [r["round"] for r in runs["r"][0][1]] == [0, 1, 2]
    assert "r is not finished; its rounds up to 2 are reported" in capsys.readouterr().out


def test_several_paths_need_out_and_a_wrong_path_is_named(tmp_path):
    first = run_dir(tmp_path, "x", [0.1, 0.5])
    second = run_dir(tmp_path, "y", [0.1, 0.6])
    with pytest.raises(SystemExit, match="--out"):
        build_report_for([first, second], None)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="empty: neither a run directory"):
        build_report_for([tmp_path / "empty"], None)
    table = build_report_for([first, second], tmp_path / "out")
    assert "| x | 1 |" in table and "| y | 1 |" in table


SPEC = """title = "Tiny sweep"
claim = "b beats a"
targets = [0.75]
seeds = [0, 1]
baselines = { "" = "a" }
[variants.b]
[variants.a]
"""


def test_a_kept_sweep_file_gives_title_targets_order_and_baselines(tmp_path):
    sweep = sweep_folder(tmp_path, spec=SPEC)
    table = build_report_for([sweep], None)
    report = (sweep / "report.md").read_text()
    assert report.startswith("# Tiny sweep\n\nb beats a\n\n")
    assert "rounds to 75%" in table and "rounds to 70%" not in table
    rows = [line for line in table.splitlines() if line.startswith("| b |")]
    assert table.index("| b | 1 |") < table.index("| a | 2 |")  # the file's variant order
    assert rows and "speedup" in report.lower()
    table = build_report_for([sweep], tmp_path / "out", targets=[0.6])  # --target wins
    assert "rounds to 60%" in table and "rounds to 75%" not in table


def test_a_sweep_folder_without_its_file_keeps_the_old_defaults(tmp_path):
    sweep = sweep_folder(tmp_path)
    table = build_report_for([sweep], None)
    assert "rounds to 60%" in table and "rounds to 70%" in table
    assert (sweep / "report.md").read_text().startswith("| variant |")
