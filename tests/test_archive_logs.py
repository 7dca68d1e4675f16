"""Archived run logs (``python -m simulation archive-logs``): the xz-compressed round log,
config and partitions read as they are by fedapp.run_log and the report and sweep tools;
a damaged compressed log named, never a traceback; the archive's size limit; a sweep
continued from archived runs skips them."""

from __future__ import annotations

import hashlib
import json
import lzma
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from fedapp.run_log import DamagedLogError, read_json, read_rounds, run_directories, run_finished
from fedapp.run_outputs import read_config
from simulation import sweep
from simulation.__main__ import main
from simulation.archive_logs import EXPERIMENT_LIMIT, archive
from simulation.report import build_report, collect, collect_paths, is_run_dir, is_sweep_folder
from simulation.report_partitions import label_counts

ROUNDS = 3
SWEEP_TOML = f"""
seeds = [0, 1]
num-supernodes = 2
[base]
num-server-rounds = {ROUNDS}
[variants.a]
lr = 0.1
[variants.b]
lr = 0.2
"""


def records(accuracies: list[float]) -> list[dict]:
    return [{"round": r, "accuracy": a, "loss": 1.0 - a, "bytes-up": 100 * r,
             "wall-seconds": 0.5 + r}  # a machine timing: left out of the archive
            for r, a in enumerate(accuracies)]


def write_run(parent: Path, name: str, accuracies: list[float], rounds: int = ROUNDS,
              model: bool = True) -> Path:
    """A run directory as a sweep run leaves it: logs, a model, outputs rebuilt from the log."""
    run = parent / name
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(
        {"run-config": {"num-server-rounds": rounds, "strategy": "fedavg", "lr": 0.1}}))
    (run / "rounds.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n"
                                              for r in records(accuracies)))
    (run / "partitions.json").write_text(json.dumps({"0": [5, 1], "1": [0, 7]}))
    (run / "device_profiles.csv").write_text("device,speed\n0,1.0\n")
    for left_out in ("server.log", "server.pid", "metrics.csv", "summary.json",
                     "accuracy_loss_vs_round.png", "checkpoint.json",
                     "checkpoint-round2-0123abcd.npz"):
        (run / left_out).write_bytes(b"x" * 10)
    if model:
        (run / "final_model.pt").write_bytes(b"model")
    return run


def sweep_folder(tmp_path: Path) -> Path:
    """A sweep folder (<variant>/seed<k>/<run>/): three finished runs and an unfinished one."""
    folder = tmp_path / "runs" / "tiny_experiment"
    write_run(folder / "a" / "seed0", "20260101-000000-fedavg-run1", [0.1, 0.4, 0.6, 0.7])
    write_run(folder / "a" / "seed1", "20260101-000100-fedavg-run1", [0.1, 0.3, 0.5, 0.6])
    write_run(folder / "b" / "seed0", "20260101-000200-fedavg-run1", [0.1, 0.5, 0.7, 0.8])
    write_run(folder / "b" / "seed1", "20260101-000300-fedavg-run1", [0.1, 0.5], model=False)
    return folder


def compress(path: Path) -> Path:
    """Replace ``path`` by ``path.xz``."""
    target = path.with_name(path.name + ".xz")
    target.write_bytes(lzma.compress(path.read_bytes(), format=lzma.FORMAT_XZ))
    path.unlink()
    return target


def archived_run(tmp_path: Path, accuracies=(0.1, 0.4, 0.6, 0.7)) -> Path:
    """A finished run directory kept as an archive keeps it: compressed logs, no model."""
    run = write_run(tmp_path / "v" / "seed0", "20260101-000000-fedavg-run1", list(accuracies),
                    model=False)
    for name in ("rounds.jsonl", "config.json", "partitions.json"):
        compress(run / name)
    return run


# ---------------------------------------------------------------- reading compressed logs
def test_compressed_logs_read_as_the_plain_ones(tmp_path):
    run = archived_run(tmp_path)
    assert not (run / "rounds.jsonl").exists() and (run / "rounds.jsonl.xz").is_file()
    assert read_rounds(run) == records([0.1, 0.4, 0.6, 0.7])
    assert read_json(run, "config.json")["run-config"]["num-server-rounds"] == ROUNDS
    assert read_config(run)["run-config"]["lr"] == 0.1
    assert label_counts(run).tolist() == [[5, 1], [0, 7]]
    assert run_finished(run)  # no model: its last record is the evaluated last round


def test_run_directories_are_found_by_either_log_name_in_path_order(tmp_path):
    compressed = archived_run(tmp_path)
    plain = write_run(tmp_path / "v" / "seed0", "20260101-000000-fedavg-run1-2", [0.1, 0.2])
    (tmp_path / "v" / "seed0" / "not-a-run").mkdir()
    assert run_directories(tmp_path, "*/seed*/*") == [compressed, plain]
    assert run_directories(tmp_path / "v" / "seed0") == [compressed, plain]
    assert is_run_dir(compressed) and is_sweep_folder(tmp_path)
    runs, _ = collect_paths([tmp_path / "v" / "seed0"])  # a folder of run directories
    assert [d for items in runs.values() for d, _ in items] == [compressed, plain]


def test_a_plain_log_is_read_before_a_compressed_one_beside_it(tmp_path):
    run = archived_run(tmp_path)
    (run / "rounds.jsonl").write_text(json.dumps({"round": 0, "accuracy": 0.9}) + "\n")
    assert read_rounds(run) == [{"round": 0, "accuracy": 0.9}]


def test_a_report_of_archived_logs_equals_the_report_of_the_plain_ones(tmp_path, capsys):
    plain = sweep_folder(tmp_path)
    archived = tmp_path / "archive" / plain.name
    archive(plain, archived, pages=tmp_path / "pages")
    out_plain, out_archived = tmp_path / "report-plain", tmp_path / "report-archived"
    build_report(plain, out_plain, [0.6])
    build_report(archived, out_archived, [0.6])
    for name in ("report.md", "report.csv"):
        assert (out_plain / name).read_bytes() == (out_archived / name).read_bytes(), name
    table = (out_archived / "report.md").read_text()
    assert "| fedavg (a) | 2 | 65.00 ± 7.07 |" in table
    assert "2 clients, partition seed 0" in table  # the label counts of partitions.json.xz


# ---------------------------------------------------------------- damaged compressed logs
@pytest.mark.parametrize("damage", [
    lambda data: data[: len(data) // 2],  # cut short in copying
    lambda data: data[:40] + bytes([data[40] ^ 0xFF]) + data[41:],  # one byte flipped
    lambda data: b"",  # empty
    lambda data: b"not xz at all\n",
])
def test_a_damaged_compressed_log_is_an_error_naming_the_file(tmp_path, damage):
    run = archived_run(tmp_path)
    log = run / "rounds.jsonl.xz"
    log.write_bytes(damage(log.read_bytes()))
    with pytest.raises(DamagedLogError, match=r"rounds\.jsonl\.xz: not a whole xz file") as info:
        read_rounds(run)
    assert str(log) in str(info.value) and "move the run directory aside" in str(info.value)
    with pytest.warns(RuntimeWarning, match=r"rounds\.jsonl\.xz: .*not counted as finished"):
        assert not run_finished(run)


def test_a_damaged_compressed_config_names_its_file(tmp_path):
    run = archived_run(tmp_path)
    (run / "config.json.xz").write_bytes(b"\xfd7zXZ\x00 broken")
    with pytest.raises(DamagedLogError, match=r"config\.json\.xz: not a whole xz file"):
        read_json(run, "config.json")
    assert read_config(run) == {}  # the report's labels: a run without a config


def test_a_compressed_log_that_is_not_json_names_file_and_line(tmp_path):
    run = archived_run(tmp_path)
    log = run / "rounds.jsonl.xz"
    log.write_bytes(lzma.compress(b'{"round": 0}\nnot json\n{"round": 2}\n'))
    with pytest.raises(ValueError, match=r"rounds\.jsonl\.xz, line 2: not JSON"):
        read_rounds(run)


def test_the_report_and_the_sweep_pass_over_a_damaged_archive_with_its_name(tmp_path, capsys):
    folder = tmp_path / "archive"
    archive(sweep_folder(tmp_path), folder, pages=tmp_path / "pages")
    log = next(folder.glob("a/seed0/*/rounds.jsonl.xz"))
    log.write_bytes(log.read_bytes()[:-30])
    with pytest.warns(RuntimeWarning, match=str(log)):
        runs = collect(folder)
    assert {v: len(items) for v, items in runs.items()} == {"a": 1, "b": 1}
    spec = sweep.load_sweep(write_toml(tmp_path, SWEEP_TOML))
    damaged = sweep.plan(spec, folder)[0]  # variant a, seed 0
    assert sweep.finished_run_dir(damaged) is None
    printed = capsys.readouterr().out
    assert f"a seed 0: not counted as done: {log}: not a whole xz file" in printed


def test_a_report_of_a_damaged_run_directory_stops_with_the_file_named(tmp_path):
    run = archived_run(tmp_path)
    log = run / "rounds.jsonl.xz"
    log.write_bytes(log.read_bytes()[:-30])
    with pytest.raises(SystemExit) as info:
        main(["report", str(run)])
    assert str(info.value).startswith(f"{log}: not a whole xz file")
    with pytest.warns(RuntimeWarning, match=str(log)), pytest.raises(SystemExit, match="no fin"):
        main(["report", str(tmp_path)])  # the sweep folder: the run is passed over, with why


# ---------------------------------------------------------------- archive-logs
def test_archive_logs_copies_finished_runs_compressed_and_leaves_the_rest_out(tmp_path, capsys):
    folder = sweep_folder(tmp_path)
    to = tmp_path / "docs" / "results" / "run-logs" / "tiny_experiment"
    assert main(["archive-logs", str(folder), "--to", str(to),
                 "--pages", str(tmp_path / "docs" / "results")]) == 0
    printed = capsys.readouterr().out
    assert "b/seed1/20260101-000300-fedavg-run1 is not finished; not archived" in printed
    assert "tiny_experiment: 3 runs" in printed and "of the 1024 KiB" in printed
    assert run_directories(to, "*/seed*/*") == [to / d.relative_to(folder) for d in
                                                run_directories(folder, "*/seed*/*")[:3]]
    for source in run_directories(folder, "*/seed*/*")[:3]:
        copy = to / source.relative_to(folder)
        assert sorted(p.name for p in copy.iterdir()) == [
            "config.json.xz", "partitions.json.sha256", "rounds.jsonl.xz"]  # no device profiles
        assert lzma.decompress((copy / "config.json.xz").read_bytes()) == \
            (source / "config.json").read_bytes()
        assert read_json(copy, "partitions.json") == json.loads(
            (source / "partitions.json").read_text())
        timed = read_rounds(source)
        assert read_rounds(copy) == [{k: v for k, v in r.items() if k != "wall-seconds"}
                                     for r in timed] and run_finished(copy)
        assert all("wall-seconds" in r for r in timed)
    shared = (to / "shared").iterdir()  # the runs' partitions are alike: stored once
    assert [p.name for p in shared] == [
        hashlib.sha256((source / "partitions.json").read_bytes()).hexdigest() + ".xz"]


def test_archive_logs_refuses_over_the_limit_writing_nothing_and_names_what_to_drop(tmp_path):
    folder = sweep_folder(tmp_path)
    pages = tmp_path / "pages"
    (pages / "tiny_experiment").mkdir(parents=True)
    (pages / "tiny_experiment" / "accuracy_vs_round.png").write_bytes(
        b"p" * (EXPERIMENT_LIMIT - 500))  # the page leaves 500 bytes: less than the runs
    to = tmp_path / "archive" / "tiny_experiment"
    with pytest.raises(SystemExit) as info:
        archive(folder, to, pages=pages)
    message = str(info.value)
    assert "tiny_experiment: 3 runs" in message and "over the limit, nothing written" in message
    assert "the largest variants: a (" in message and "2 runs)" in message
    assert "--variants PATTERN" in message
    assert not to.exists()


def test_archive_logs_archives_the_variants_and_seeds_asked_for(tmp_path):
    folder = sweep_folder(tmp_path)
    to = tmp_path / "archive" / "tiny_experiment"
    archive(folder, to, pages=tmp_path / "pages", variants=["a"], seeds=[1])
    assert [d.relative_to(to).parts[:2] for d in run_directories(to, "*/seed*/*")] == [
        ("a", "seed1")]


def test_archiving_again_in_place_replaces_the_runs_and_keeps_them_readable(tmp_path):
    folder = sweep_folder(tmp_path)
    to = tmp_path / "archive" / "tiny_experiment"
    first = archive(folder, to, pages=tmp_path / "pages")
    before = {p: p.read_bytes() for p in to.rglob("*") if p.is_file()}
    again = archive(to, to, pages=tmp_path / "pages")  # an archive archived: unchanged
    assert {p: p.read_bytes() for p in to.rglob("*") if p.is_file()} == before
    assert again.split(";")[1] == first.split(";")[1]  # same total with the page


def test_archive_logs_of_a_folder_without_finished_runs_says_so(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="no finished runs under .*empty.*nothing written"):
        archive(tmp_path / "empty", tmp_path / "to", pages=tmp_path / "pages")
    with pytest.raises(SystemExit, match="is not a folder"):
        archive(tmp_path / "missing", tmp_path / "to", pages=tmp_path / "pages")


# ---------------------------------------------------------------- sweep over archived runs
def write_toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sweep.toml"
    path.write_text(text)
    return path


def test_a_sweep_continued_from_archived_runs_skips_them(tmp_path, monkeypatch, capsys):
    """The run-logs README: copy the archive into runs/ and sweep; only the cell the
    archive lacks (b, seed 1: it was not finished) runs."""
    folder = sweep_folder(tmp_path)
    archived = tmp_path / "archive" / "tiny_experiment"
    archive(folder, archived, pages=tmp_path / "pages")
    out = tmp_path / "continued"
    shutil.copytree(archived, out)
    spec = sweep.load_sweep(write_toml(tmp_path, SWEEP_TOML))
    runs = sweep.plan(spec, out)
    assert [sweep.finished_run_dir(r) is not None for r in runs] == [True, True, True, False]
    ran = []

    def run_the_missing_cell(run_config, federation, **kwargs):
        directory = Path(run_config["output-dir"])
        ran.append(directory.relative_to(out.resolve()).parts)
        write_run(directory, "20260102-000000-fedavg-run1", [0.1, 0.5, 0.6, 0.9])
        return SimpleNamespace(returncode=0, status="ok", output="")

    monkeypatch.setattr(sweep, "run_app", run_the_missing_cell)
    monkeypatch.setattr(sweep, "git_state", lambda: {"git-commit": "abc", "git-dirty": False})
    done = sweep.execute(spec, out)
    assert ran == [("b", "seed1")]
    assert [(r.variant, r.seed) for r, _ in done] == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    assert capsys.readouterr().out.count("already done") == 3


def test_archive_logs_keeps_the_machine_timings_only_when_asked(tmp_path):
    folder = sweep_folder(tmp_path)
    kept = tmp_path / "kept" / "tiny_experiment"
    archive(folder, kept, pages=tmp_path / "pages", timings=True)
    [source, *_] = run_directories(folder, "*/seed*/*")
    copy = kept / source.relative_to(folder)
    assert lzma.decompress((copy / "rounds.jsonl.xz").read_bytes()) == \
        (source / "rounds.jsonl").read_bytes()


def archived_with(tmp_path: Path, extra: dict, **keep: bool
                  ) -> tuple[list[dict], list[dict], list[dict]]:
    """A run whose round records carry ``extra``: its records, and as archived by default
    and with the flags ``keep``."""
    folder = sweep_folder(tmp_path)
    [source, *_] = run_directories(folder, "*/seed*/*")
    rounds = [{**r, **extra} for r in read_rounds(source)]
    (source / "rounds.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n"
                                                 for r in rounds))
    plain, kept = tmp_path / "plain" / "tiny_experiment", tmp_path / "kept" / "tiny_experiment"
    archive(folder, plain, pages=tmp_path / "pages")
    archive(folder, kept, pages=tmp_path / "pages", **keep)
    relative = source.relative_to(folder)
    return rounds, read_rounds(plain / relative), read_rounds(kept / relative)


def test_archive_logs_leaves_out_the_values_per_candidate_client_unless_asked(tmp_path):
    scored, without, with_candidates = archived_with(
        tmp_path, {"selection-scores": {"3": 0.5, "7": 0.25}, "poc-losses": {"3": 1.5}},
        candidates=True)
    assert [r["accuracy"] for r in without] == [r["accuracy"] for r in scored]
    assert not any({"selection-scores", "poc-losses", "wall-seconds"} & set(r) for r in without)
    assert [r["selection-scores"] for r in with_candidates] == \
        [r["selection-scores"] for r in scored]
    assert all("wall-seconds" not in r for r in with_candidates)


def test_archive_logs_leaves_out_the_values_per_client_unless_asked(tmp_path):
    per_client = {"client-widths": {"3": 0.5, "7": 1.0}, "width-counts": {"0.5": 1, "1": 1},
                  "dropped-out": ["7"], "clients-dropped-out": 1}
    logged, without, with_them = archived_with(tmp_path, per_client, per_client=True)
    assert not any({"client-widths", "dropped-out"} & set(r) for r in without)
    for counted in ("width-counts", "clients-dropped-out"):
        assert [r[counted] for r in without] == [r[counted] for r in logged]
    for key in ("client-widths", "dropped-out"):
        assert [r[key] for r in with_them] == [r[key] for r in logged]


# ---------------------------------------------------------------- files archived once
def shared_archive(tmp_path: Path) -> tuple[Path, Path, Path]:
    """An archive of the tiny sweep, one of its runs, and that run's shared partitions file."""
    folder = sweep_folder(tmp_path)
    to = tmp_path / "archive" / "tiny_experiment"
    archive(folder, to, pages=tmp_path / "pages")
    run = run_directories(to, "*/seed*/*")[0]
    digest = (run / "partitions.json.sha256").read_text().strip()
    return to, run, to / "shared" / f"{digest}.xz"


def test_runs_with_other_partitions_keep_their_own_shared_copy(tmp_path):
    folder = sweep_folder(tmp_path)
    [first, second, *_] = run_directories(folder, "*/seed*/*")
    (second / "partitions.json").write_text(json.dumps({"0": [1, 1], "1": [2, 2]}))
    to = tmp_path / "archive" / "tiny_experiment"
    archive(folder, to, pages=tmp_path / "pages")
    assert len(list((to / "shared").iterdir())) == 2
    assert label_counts(to / second.relative_to(folder)).tolist() == [[1, 1], [2, 2]]
    assert label_counts(to / first.relative_to(folder)).tolist() == [[5, 1], [0, 7]]


def test_a_tuning_run_five_folders_deep_finds_the_shared_copy(tmp_path):
    to, run, copy = shared_archive(tmp_path)
    deep = to / "tuning" / "a" / "lr=0.1" / "seed100" / run.name
    shutil.copytree(run, deep)
    assert label_counts(deep).tolist() == [[5, 1], [0, 7]]


@pytest.mark.parametrize("reference, expected", [
    ("../../../../etc/passwd", "not the sha256 digest"),
    ("0" * 64, "is in none of the 6 folders above the run"),
    ("f" * 64 + "0" * 10_000_000, "not the sha256 digest"),  # a planted 10 MB file: 128 bytes read
])
def test_a_bad_reference_is_an_error_naming_it(tmp_path, reference, expected):
    _, run, _ = shared_archive(tmp_path)
    (run / "partitions.json.sha256").write_text(reference + "\n")
    with pytest.raises(DamagedLogError, match=expected) as info:
        read_json(run, "partitions.json")
    assert str(run / "partitions.json.sha256") in str(info.value)
    assert label_counts(run) is None  # the report draws no picture from it, and goes on


def test_a_shared_copy_with_other_content_is_an_error_naming_it(tmp_path):
    _, run, copy = shared_archive(tmp_path)
    copy.write_bytes(lzma.compress(b'{"0": [9, 9]}', format=lzma.FORMAT_XZ))
    with pytest.raises(DamagedLogError, match="does not have the sha256 digest") as info:
        read_json(run, "partitions.json")
    assert str(copy) in str(info.value)


def test_the_archived_model_digest_is_its_first_12_hex_digits(tmp_path):
    folder = sweep_folder(tmp_path)
    [source, *_] = run_directories(folder, "*/seed*/*")
    digests = [f"{r:064x}" for r in range(ROUNDS + 1)]
    hashed = [{**r, "model-sha256": d} for r, d in zip(read_rounds(source), digests)]
    (source / "rounds.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n"
                                                 for r in hashed))
    to = tmp_path / "archive" / "tiny_experiment"
    archive(folder, to, pages=tmp_path / "pages")
    kept = [r["model-sha256"] for r in read_rounds(to / source.relative_to(folder))]
    assert kept == [d[:12] for d in digests] and all(len(k) == 12 for k in kept)
