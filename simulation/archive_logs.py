"""``python -m simulation archive-logs RUNS_FOLDER``: a sweep's finished runs, small enough
for git.

Copies every finished run (:func:`fedapp.run_log.run_finished`) of a sweep folder
(``<variant>/seed<k>/<run>/``) into ``--to`` (default ``docs/results/run-logs/<folder
name>``), in the same layout, each JSON file xz-compressed (``rounds.jsonl.xz``,
``config.json.xz``, ``partitions.json.xz``: :mod:`fedapp.run_log` reads them as they are,
so ``report``, ``results`` and ``sweep`` use the archive directly). Left out
(:data:`LEFT_OUT`): models and checkpoints, tracking files, what the run outputs rebuild
from the round log (``metrics.csv``, ``summary.json``, plots), the console output
(``server.log``), ``server.pid`` and the fleet's ``device_profiles.csv``; any other file of
a run is copied as it is (CSV files xz-compressed too). The round log keeps every record and
field a rerun reproduces; the machine's timings and memory (``LOG_TIMING_KEYS``) are left
out unless ``--timings`` (a third of an 80-round log), and so are the selection's values per
candidate client (``LOG_PER_CANDIDATE_KEYS``: Oort's utilities, Power-of-Choice's losses,
which no report reads) unless ``--candidates`` (half to two thirds of a selection run's
archived log), and the values per client that a count sums up (``LOG_PER_CLIENT_KEYS``: each
client's width, which ``width-counts`` counts per width, a quarter of a width run's archived
log; the clients that dropped out, which ``clients-dropped-out`` counts, 3 % of a FLASH width
run's) unless ``--per-client``. The model digest of every round (``model-sha256``) is kept as its first
:data:`DIGEST_HEX` hex digits, 48 bits: enough to tell whether a rerun trained the same
model (a different model matches by chance once in 2.8e14), in a fifth of the room (the
full digests were a third of a 10 KB archived log; 16 hex digits, kept until 2026-11-30,
took 16 KiB more of width_protocol_flash's 828 KiB archive). A file that
many runs have alike (:data:`SHARED_NAMES`: ``partitions.json``, one per partition setting,
3.7 KB each) is stored once, as ``shared/<sha256>.xz`` at the archive's top, each run keeping
``partitions.json.sha256`` (:mod:`fedapp.run_log` follows it). A tuned sweep's tuning runs
(``tuning/<variant>/<point>/seed<k>/<run>/``, :mod:`simulation.tuning`) are archived the
same way, with ``tuning/chosen.json`` and the kept sweep file, so that a sweep continued from
the archive neither tunes nor runs again what is there.

An experiment adds at most 1 MiB to the repository (:data:`EXPERIMENT_LIMIT`): its archive
plus its page (``docs/results/<name>/`` and ``docs/results/<name>.md``, ``--pages``). The
command prints these sizes and, when they would exceed the limit, writes nothing and names
the largest variants to leave out (``--variants`` / ``--seeds`` choose what is archived).
An archived run already in ``--to`` is replaced; other runs there are kept.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import lzma
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from fedapp.atomic_file import write_bytes_atomically
from fedapp.run_log import (COMPRESSED, ROUNDS_LOG, SHARED_FOLDER, SHARED_REFERENCE,
                            run_directories, run_finished)
from strategies import contract as C

from .sweep import SWEEP_COPY
from .tuning import CHOSEN, TUNING_FOLDER

EXPERIMENT_LIMIT = 1024 * 1024  # bytes one experiment may add: its run logs and its page
XZ_PRESET = 6 | lzma.PRESET_EXTREME  # as small as preset 9 on these logs, an 8 MiB dictionary
COMPRESSED_KINDS = (".json", ".jsonl", ".csv")  # what is stored as <name>.xz
SHARED_NAMES = ("partitions.json",)  # stored once per content: shared/<sha256>.xz
DIGEST_HEX = 12  # model-sha256 archived as its first 12 hex digits (48 bits)
LEFT_OUT = {  # file-name pattern -> why a run's file is not archived
    "*.pt": "a model",
    "checkpoint*": "a checkpoint",
    "events.out.tfevents.*": "tracking (rebuilt from the round log)",
    "mlflow.db": "tracking (rebuilt from the round log)",
    "metrics.csv": "rebuilt from the round log",
    "summary.json": "rebuilt from the round log",
    "*.png": "a plot (rebuilt from the logs)",
    "server.log": "console output",
    "server.pid": "process state",
    "device_profiles.csv": "rebuilt from the run config (a generated fleet is a function of "
                           "its seed; a trace fleet is its own file)",
}
DEFAULT_ARCHIVE = Path("docs/results/run-logs")
DEFAULT_PAGES = Path("docs/results")


@dataclass
class ArchivedRun:
    """One finished run as it will be stored: its place in the archive and its files."""

    variant: str
    relative: Path  # <variant>/seed<k>/<run>
    files: dict[str, bytes] = field(default_factory=dict)  # stored name -> content
    source_bytes: int = 0
    shared: dict[str, bytes] = field(default_factory=dict)  # sha256 -> compressed content

    @property
    def size(self) -> int:
        """Bytes of the run's own files (its shared ones are counted once, by the archive)."""
        return sum(len(content) for content in self.files.values())


def left_out_why(name: str) -> str | None:
    """Why the run file ``name`` is not archived (None: it is)."""
    return next((why for pattern, why in LEFT_OUT.items() if fnmatch.fnmatchcase(name, pattern)),
                None)


def left_out_keys(timings: bool = False, candidates: bool = False,
                  per_client: bool = False) -> frozenset[str]:
    """The round-log keys not archived: the machine's timings (``LOG_TIMING_KEYS``, which a
    rerun of the same seed does not reproduce) unless ``timings``, the values per candidate
    client (``LOG_PER_CANDIDATE_KEYS``) unless ``candidates``, the values per client that a
    count sums up (``LOG_PER_CLIENT_KEYS``) unless ``per_client``."""
    return ((frozenset() if timings else C.LOG_TIMING_KEYS)
            | (frozenset() if candidates else C.LOG_PER_CANDIDATE_KEYS)
            | (frozenset() if per_client else C.LOG_PER_CLIENT_KEYS))


def archived_record(record: dict, keys: frozenset[str]) -> dict:
    """A round record as archived: without the fields ``keys`` (:func:`left_out_keys`), its
    model digest cut to :data:`DIGEST_HEX` hex digits."""
    kept = {k: v for k, v in record.items() if k not in keys}
    if isinstance(kept.get(C.LOG_MODEL_SHA256), str):
        kept[C.LOG_MODEL_SHA256] = kept[C.LOG_MODEL_SHA256][:DIGEST_HEX]
    return kept


def without_keys(log: bytes, keys: frozenset[str]) -> bytes:
    """A round log as archived (:func:`archived_record`); each record as the ServerApp
    writes it (sorted keys), a line that is no JSON object kept as it is."""
    lines = []
    for line in log.decode("utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict):
            line = json.dumps(archived_record(record, keys), sort_keys=True)
        lines.append(line)
    return ("\n".join(lines) + "\n").encode() if lines else log


def compressed(content: bytes) -> bytes:
    return lzma.compress(content, format=lzma.FORMAT_XZ, preset=XZ_PRESET)


def archived_files(run_dir: Path, left_out: frozenset[str] = C.LOG_TIMING_KEYS
                   ) -> tuple[dict[str, bytes], int, dict[str, bytes]]:
    """The files of ``run_dir`` to archive (stored name -> content, JSON xz-compressed), the
    bytes they take uncompressed and its shared files (sha256 -> compressed content: a
    :data:`SHARED_NAMES` file is stored as ``<name>.sha256``, its digest); folders in a run
    directory (tracking) are left out, and the round log's keys ``left_out``
    (:func:`left_out_keys`)."""
    files, source_bytes, shared = {}, 0, {}
    for path in sorted(run_dir.iterdir()):
        if not path.is_file() or left_out_why(path.name) is not None:
            continue
        content = path.read_bytes()
        source_bytes += len(content)
        if path.name == ROUNDS_LOG:
            content = without_keys(content, left_out)
        if path.name in SHARED_NAMES:
            digest = hashlib.sha256(content).hexdigest()
            files[path.name + SHARED_REFERENCE] = (digest + "\n").encode()
            shared[digest] = compressed(content)
        elif path.suffix in COMPRESSED_KINDS:
            files[path.name + COMPRESSED] = compressed(content)
        else:
            files[path.name] = content
    return files, source_bytes, shared


def select_runs(folder: Path, variants: list[str] | None = None,
                seeds: list[int] | None = None,
                left_out: frozenset[str] = C.LOG_TIMING_KEYS
                ) -> tuple[list[ArchivedRun], list[Path]]:
    """The finished runs of sweep folder ``folder`` (of the variants matching one of the
    shell-style ``variants`` patterns and of ``seeds``, where given), read and compressed,
    and the run directories passed over as not finished."""
    runs, unfinished = [], []
    tuned = run_directories(folder, f"{TUNING_FOLDER}/*/*/seed*/*")  # <variant>/<point>/...
    for run_dir in run_directories(folder, "*/seed*/*") + tuned:
        tuning = run_dir in tuned
        variant = (run_dir.parent.parent.parent if tuning else run_dir.parent.parent).name
        seed_folder = run_dir.parent.name
        if variants is not None and not any(fnmatch.fnmatchcase(variant, p) for p in variants):
            continue
        if seeds is not None and not tuning and seed_folder not in {f"seed{s}" for s in seeds}:
            continue
        if not run_finished(run_dir):
            unfinished.append(run_dir)
            continue
        files, source_bytes, shared = archived_files(run_dir, left_out)
        runs.append(ArchivedRun(variant, run_dir.relative_to(folder), files, source_bytes,
                                shared))
    return runs, unfinished


def tree_size(path: Path, skip: set[Path] = frozenset()) -> int:
    """Bytes of the files under ``path`` (a file: its size), those under ``skip`` not counted."""
    if path.is_file():
        return path.stat().st_size
    if not path.is_dir():
        return 0
    return sum(f.stat().st_size for f in path.rglob("*")
               if f.is_file() and not any(f.is_relative_to(s) for s in skip))


def page_size(pages: Path, name: str) -> int:
    """Bytes of experiment ``name``'s page: ``pages/<name>/`` and ``pages/<name>.md``."""
    return tree_size(pages / name) + tree_size(pages / f"{name}.md")


def kib(size: int) -> str:
    return f"{size / 1024:.0f} KiB"


def what_to_drop(runs: list[ArchivedRun], excess: int) -> str:
    """The largest variants (their archived size and runs), enough of them to free
    ``excess`` bytes, as a sentence."""
    by_variant: dict[str, list[ArchivedRun]] = {}
    for run in runs:
        by_variant.setdefault(run.variant, []).append(run)
    ranked = sorted(by_variant.items(), key=lambda item: -sum(r.size for r in item[1]))
    named, freed = [], 0
    for variant, items in ranked:
        size = sum(r.size for r in items)
        named.append(f"{variant} ({kib(size)}, {len(items)} runs)")
        freed += size
        if freed >= excess:
            break
    return ("leave out runs worth at least " + kib(excess) + ", e.g. the largest variants: "
            + ", ".join(named) + "; choose what is archived with --variants PATTERN ... or "
            "--seeds K ..., or make the page smaller")


def archive(folder: Path, to: Path, pages: Path = DEFAULT_PAGES,
            variants: list[str] | None = None, seeds: list[int] | None = None,
            limit: int = EXPERIMENT_LIMIT, timings: bool = False, candidates: bool = False,
            per_client: bool = False) -> str:
    """Archive the finished runs of ``folder`` into ``to`` (module docstring); the size line.

    Raises SystemExit, having written nothing, when there is no finished run, or when the
    archive and the page of experiment ``to.name`` would exceed ``limit`` bytes."""
    if not folder.is_dir():
        raise SystemExit(f"archive-logs: {folder} is not a folder; give a sweep's results "
                         "folder (<variant>/seed<k>/<run>/)")
    runs, unfinished = select_runs(folder, variants, seeds,
                                   left_out_keys(timings, candidates, per_client))
    for run_dir in unfinished:
        print(f"note: {run_dir} is not finished; not archived")
    if not runs:
        raise SystemExit(f"archive-logs: no finished runs under {folder} (expected "
                         "<variant>/seed<k>/<run>/ with a complete rounds.jsonl); nothing "
                         "written")
    replaced = {to / run.relative for run in runs}
    kept = tree_size(to, replaced)
    shared = {digest: content for run in runs for digest, content in run.shared.items()
              if not (to / SHARED_FOLDER / (digest + COMPRESSED)).is_file()}
    added = sum(run.size for run in runs) + sum(len(c) for c in shared.values())
    logs = kept + added
    page = page_size(pages, to.name)
    line = (f"{to.name}: {len(runs)} runs, {kib(sum(r.source_bytes for r in runs))} of logs "
            f"-> {kib(added)} compressed"
            + (f", {kib(kept)} already archived" if kept else "")
            + f"; with the page ({kib(page)}) {kib(logs + page)} of the {kib(limit)} an "
            "experiment may add")
    if logs + page > limit:
        raise SystemExit(f"archive-logs: {line}: over the limit, nothing written; "
                         + what_to_drop(runs, logs + page - limit))
    for run in runs:
        target = to / run.relative
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        for name, content in run.files.items():
            write_bytes_atomically(target / name, content)
    for digest, content in shared.items():
        (to / SHARED_FOLDER).mkdir(parents=True, exist_ok=True)
        write_bytes_atomically(to / SHARED_FOLDER / (digest + COMPRESSED), content)
    for kept_file in (Path(SWEEP_COPY), Path(TUNING_FOLDER) / CHOSEN):  # small, read as they are
        if (folder / kept_file).is_file():
            (to / kept_file).parent.mkdir(parents=True, exist_ok=True)
            write_bytes_atomically(to / kept_file, (folder / kept_file).read_bytes())
    return line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The archive-logs options."""
    parser.add_argument("folder", type=Path, metavar="RUNS_FOLDER",
                        help="a sweep's results folder (<variant>/seed<k>/<run>/)")
    parser.add_argument("--to", type=Path, default=None,
                        help=f"the experiment's archive (default: {DEFAULT_ARCHIVE}/<RUNS_FOLDER "
                             "name>); its name is the experiment's")
    parser.add_argument("--pages", type=Path, default=DEFAULT_PAGES,
                        help="the folder of the experiment pages (<name>/ and <name>.md), "
                             "counted in the experiment's size")
    parser.add_argument("--variants", nargs="+", default=None, metavar="PATTERN",
                        help="archive only the variants matching one of these shell patterns")
    parser.add_argument("--seeds", nargs="+", type=int, default=None, metavar="K",
                        help="archive only these seeds")
    parser.add_argument("--timings", action="store_true",
                        help="keep the round logs' machine timings and memory (left out by "
                             "default: a rerun does not reproduce them)")
    parser.add_argument("--candidates", action="store_true",
                        help="keep the round logs' values per candidate client (Oort's "
                             "selection-scores, Power-of-Choice's poc-losses; left out by "
                             "default: no report reads them)")
    parser.add_argument("--per-client", "--client-widths", action="store_true",
                        dest="per_client",
                        help="keep the round logs' values per client that a count sums up "
                             "(client-widths, dropped-out; left out by default: width-counts "
                             "and clients-dropped-out keep their counts)")


def run(args: argparse.Namespace) -> int:
    """Archive and print the size line."""
    to = args.to if args.to is not None else DEFAULT_ARCHIVE / args.folder.resolve().name
    print(archive(args.folder, to, args.pages, args.variants, args.seeds,
                  timings=args.timings, candidates=args.candidates,
                  per_client=args.per_client))
    return 0
