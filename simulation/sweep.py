"""``python -m simulation sweep FILE.toml``: variants x seeds through the real ``flwr run``.

A sweep file names a shared run config (``[base]``), named variants that override it
(``[variants.<name>]``), the seeds and the federation size. Every run goes through the
same ServerApp/ClientApp on Flower's simulation engine (``simulation.runtime``). Each
run writes to ``<out>/<variant>/seed<k>/``; finished runs (a complete ``rounds.jsonl``,
:func:`fedapp.run_log.run_finished`) are skipped, so an interrupted sweep resumes; with
``checkpoint-every`` in the sweep's run config, a run that was stopped part-way resumes
from its last checkpoint (``resume-from``, bit-identical to an uninterrupted run) instead
of starting again. It resumes only a checkpoint written with the run config it would run
now (the checkpoint's config digest: same variant, seed and output folder) and says why
it passes over any other. Variant names are single safe folder names (checked before any
run). At the end, ``summary.md`` and ``summary.csv`` hold final and best accuracy (mean ±
std over seeds). The sweep file is kept as ``<out>/sweep.toml`` (its title, targets and
baselines are what ``python -m simulation report <out>`` uses), and each run's streamed
ServerApp output as ``server.log`` in its run directory. Every finished run gets
``provenance.json`` (:mod:`simulation.provenance`: commit, dirty flag, seeds). A file that
makes ``[[claims]]`` is held to the comparison protocol (:mod:`simulation.protocol`); with
``[tuning]`` its tuning runs come first (:mod:`simulation.tuning`).
"""

from __future__ import annotations

import argparse
import csv
import difflib
import fnmatch
import re
import statistics
import sys
import time
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from fedapp.checkpoint import CHECKPOINT_NAME, LEGACY_NAME, config_digest, load_checkpoint
from fedapp.config import ConfigError, RunConfig, toml_value
from fedapp.run_log import read_rounds, run_directories, run_finished
from strategies import contract as C

from .metrics import evaluated, percent_over_seeds
from .preflight import refuse_bad_run_configs
from .progress import SweepProgress
from .protocol import check_protocol, variant_config
from .provenance import git_state
from .provenance import record as record_provenance
from .run import app_config
from .runtime import (FederationConfigError, federation_value, refuse_unfittable, run_app,
                      unused_gpus_note)
from .runtime.ray_cluster import ray_address
from .tuning import choose, tuning_config, tuning_of, tuning_runs


# sweep-file key -> (the federation option it sets: flwr run --federation-config, default;
# None: Flower's own default, the option not passed)
FEDERATION_KEYS = {"num-supernodes": ("num-supernodes", 10),
                   "cpus-per-client": ("client-resources-num-cpus", 1),
                   "gpus-per-client": ("client-resources-num-gpus", None)}
# every top-level key a sweep file may have: what the sweep runs, then what its report
# shows (simulation/results.py)
SWEEP_KEYS = ("seeds", "base", "variants", *FEDERATION_KEYS, "timeout-seconds",
              "title", "claim", "runtime", "targets", "baselines", "published",
              "published-source", "tolerance", "claims", "tuning")
# a variant name is one folder of the results: letters, digits, . _ + = - (no leading dot)
VARIANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=-]{0,127}")
SWEEP_COPY = "sweep.toml"  # the sweep file, kept in its results folder
SERVER_LOG = "server.log"  # a run's streamed output, kept in its run directory


@dataclass(frozen=True)
class SweepRun:
    variant: str
    seed: int
    run_config: dict
    directory: Path


def load_sweep(path: Path) -> dict:
    """Parse and check a sweep file."""
    spec = tomllib.loads(Path(path).read_text())
    unknown = [key for key in spec if key not in SWEEP_KEYS]
    if unknown:  # a typo would otherwise fall back to a default without a word
        hints = [f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key)
                 for key in unknown for close in [difflib.get_close_matches(key, SWEEP_KEYS, 1)]]
        raise ValueError(f"{path}: unknown top-level key(s) {', '.join(hints)}; a sweep file "
                         f"has {', '.join(SWEEP_KEYS)} (run-config keys go in [base] or a "
                         "variant)")
    for key in ("variants", "seeds"):
        if key not in spec:
            raise ValueError(f"{path}: missing '{key}' (see simulation/experiments/*.toml)")
    for name, overrides in spec["variants"].items():
        check_variant_name(name, path)
        nested = [k for k, v in overrides.items() if isinstance(v, dict) and k != "tune"]
        if nested:
            raise ValueError(f"{path}: variant {name!r} has nested tables {nested}; a variant name "
                             f"with a dot must be quoted: [variants.\"{name}.{nested[0]}\"]")
    federation(spec, path)
    check_protocol(spec, path)
    tuning_of(spec, path)
    return spec


def check_variant_name(name: object, path: Path | str = "sweep file") -> None:
    """Refuse a variant name that is not one safe folder name (``../x``, ``a/b``, ``.hidden``,
    a NUL): every run of a variant writes under ``<out>/<variant>/``."""
    if not isinstance(name, str) or not VARIANT_NAME.fullmatch(name):
        raise ValueError(f"{path}: variant name {name!r} is not a safe folder name; it must be "
                         "1-128 letters, digits and . _ + = -, not starting with a dot (each "
                         "variant's runs go into <out>/<variant>/), e.g. "
                         f"{_safe_suggestion(name)!r}")


def _safe_suggestion(name: object) -> str:
    text = re.sub(r"[^A-Za-z0-9._+=-]+", "-", str(name)).lstrip(".-")[:128]
    return text or "variant-1"


def federation(spec: dict, path: Path | str = "sweep file") -> dict:
    """The federation options of every run of the sweep (its ``num-supernodes``,
    ``cpus-per-client`` and ``gpus-per-client``, checked: a bad one names the file, the key
    and the fix). Ray hides the GPU from a ClientApp that asks for no share of one, so the
    ClientApps train on the CPU unless ``gpus-per-client`` is given."""
    config = {}
    for key, (flower_key, default) in FEDERATION_KEYS.items():
        value = spec.get(key, default)
        if value is None:
            continue
        try:
            config[flower_key] = federation_value(flower_key, value)
        except FederationConfigError as exc:
            raise ValueError(f"{path}: {key} = {value!r} (Flower's federation option "
                             f"{flower_key}): {exc.reason}") from None
    return config


def plan(spec: dict, out: Path, seeds: list[int] | None = None,
         variants: list[str] | None = None, chosen: dict | None = None) -> list[SweepRun]:
    """Every (variant, seed) run with its full run config, in file order; with ``seeds``,
    only the runs of those seeds (e.g. one seed of every variant first); with ``variants``
    (shell-style patterns such as ``dir0.5-*``), only the variants matching one of them;
    with ``chosen`` (:func:`simulation.tuning.choose`), a tuned file's variants with their
    tuned values (a variant not tuned yet is left out)."""
    base = dict(spec.get("base", {}))
    runs = []
    for name, overrides in spec["variants"].items():
        if variants is not None and not any(fnmatch.fnmatchcase(name, p) for p in variants):
            continue
        check_variant_name(name)
        overrides = dict(overrides)
        overrides.pop("tune", None)
        if "tuning" in spec:
            if chosen is None or name not in chosen:
                continue
            overrides.update(chosen[name]["values"])
        for seed in overrides.pop("seeds", spec["seeds"]):  # a variant may name its own seeds
            if seeds is not None and seed not in seeds:
                continue
            directory = out / name / f"seed{seed}"
            config = {**base, **overrides, "seed": seed, "output-dir": str(directory.resolve())}
            runs.append(SweepRun(name, seed, config, directory))
    return runs


def finished_run_dir(run: SweepRun) -> Path | None:
    """The run directory of a completed run, if there is one (a run log damaged before its
    last line is passed over, with the reason)."""
    rounds = int(run.run_config.get("num-server-rounds", 10))
    for candidate in run_directories(run.directory):  # archived runs: rounds.jsonl.xz
        try:
            records = read_rounds(candidate)
        except (OSError, ValueError) as exc:
            print(f"{run.variant} seed {run.seed}: not counted as done: {exc}", flush=True)
            continue
        if len(records) == rounds + 1 and run_finished(candidate):
            return candidate
    return None


def resumable_run_dir(run: SweepRun) -> Path | None:
    """The newest unfinished run directory of ``run`` whose checkpoint this sweep wrote for
    this variant and seed (its config digest equals the run config's now), if any; every
    checkpoint passed over is named with the reason."""
    digest = config_digest(RunConfig.from_user_config(run.run_config).to_dict())
    candidates = {p.parent for name in (CHECKPOINT_NAME, LEGACY_NAME)
                  for p in run.directory.glob(f"*/{name}")}
    for candidate in sorted(candidates, reverse=True):
        if run_finished(candidate):
            continue
        why = checkpoint_refusal(candidate, digest)
        if why is None:
            return candidate
        print(f"{run.variant} seed {run.seed}: not resuming {candidate}: {why}", flush=True)
    return None


def checkpoint_refusal(run_dir: Path, digest: str) -> str | None:
    """Why the checkpoint in ``run_dir`` is not one to resume with config digest ``digest``
    (None: resume it)."""
    try:
        payload = load_checkpoint(run_dir)
    except ConfigError as exc:
        return str(exc)
    if payload["config-digest"] != digest:
        return ("its checkpoint was written with another run config (config digest "
                f"{payload['config-digest'][:12]}..., this variant and seed now "
                f"{digest[:12]}...); the run starts afresh in a new run directory")
    return None


def sweep_file_fix(values: Mapping[str, object]) -> str:
    """The sweep file's lines (TOML, in the variant's table or [base]) that set ``values``."""
    return "; ".join(f"{key} = {toml_value(value)}" for key, value in values.items()) + \
        " in the variant's table (or [base])"


def execute(
    spec: dict, out: Path, ray_address: str | None = None, seeds: list[int] | None = None,
    variants: list[str] | None = None,
) -> list[tuple[SweepRun, Path]]:
    """Run what is not finished yet (from its last checkpoint where there is one); return
    (run, run directory) for all finished runs. A file with ``[tuning]`` runs its tuning
    runs first (:mod:`simulation.tuning`) and each variant's seeds once its tuning is done.
    Every run's config is checked first (SystemExit naming the variant and seed:
    :mod:`.preflight`)."""
    federation_config = federation(spec)
    chosen = None
    if "tuning" in spec:
        chosen = tune(spec, out, federation_config, ray_address, variants)
    runs = plan(spec, out, seeds, variants, chosen)
    return run_all(runs, spec, out, federation_config, ray_address)


def run_all(runs: list[SweepRun], spec: dict, out: Path, federation_config: dict,
            ray_address: str | None) -> list[tuple[SweepRun, Path]]:
    """Check every run's config, then run each one not finished yet; (run, run directory)
    of the finished ones."""
    refuse_bad_run_configs(((f"variant {run.variant!r}, seed {run.seed}", run.run_config)
                            for run in runs), federation_config, fix_as=sweep_file_fix)
    done = []
    with SweepProgress(sum(rounds_of(run) for run in runs)) as progress:
        for index, run in enumerate(runs, 1):
            label = f"[{index}/{len(runs)}] {run.variant} seed {run.seed}"
            existing = finished_run_dir(run)
            if existing is None:
                existing = execute_one(run, label, spec, out, federation_config, ray_address,
                                       progress)
                if existing is None:
                    continue
            else:
                progress.skip(rounds_of(run))
                print(f"{label}: already done ({existing})", flush=True)
            done.append((run, existing))
    return done


def tune(spec: dict, out: Path, federation_config: dict, ray_address: str | None,
         variants: list[str] | None) -> dict:
    """Run the tuning runs of the selected variants and choose each variant's values
    (:func:`simulation.tuning.choose`); variant -> choice, for the variants whose tuning
    runs all finished (the others are named)."""
    names = [name for name in spec["variants"] if variants is None
             or any(fnmatch.fnmatchcase(name, p) for p in variants)]
    planned = tuning_runs(spec, out, names)
    seed = spec["tuning"]["seed"]
    runs = [SweepRun(f"{t.variant} (tuning {t.point})", seed,
                     tuning_config(variant_config(spec, t.variant), t, seed), t.directory)
            for t in planned]
    done = {run.directory: directory
            for run, directory in run_all(runs, spec, out, federation_config, ray_address)}
    chosen = choose(planned, {t: done[t.directory] for t in planned if t.directory in done}, out)
    for name in names:
        if name in chosen:
            print(f"{name}: tuned to {chosen[name]['point']} (validation score "
                  f"{chosen[name]['scores'][chosen[name]['point']]:.4f})", flush=True)
        else:
            print(f"{name}: its tuning runs did not all finish; its seeds wait", flush=True)
    return chosen


def rounds_of(run: SweepRun) -> int:
    """The run's num-server-rounds."""
    return int(run.run_config.get("num-server-rounds", 10))


def execute_one(run: SweepRun, label: str, spec: dict, out: Path, federation: dict,
                ray_address: str | None, progress: SweepProgress) -> Path | None:
    """One ``flwr run`` of the sweep (from its last checkpoint where there is one); its run
    directory, or None if it failed."""
    start = time.monotonic()
    run_config = dict(run.run_config)
    partial = resumable_run_dir(run)
    if partial is not None:
        run_config["resume-from"] = str(partial.resolve())
        print(f"{label}: resuming from the checkpoint in {partial} ...", flush=True)
    else:
        print(f"{label}: running ...", flush=True)
    before = run_dirs(run.directory)
    code = git_state()  # the code this run's FAB is built from (provenance.json)
    try:
        result = run_app(
            run_config,
            federation,
            flwr_home=out / ".flwr",
            capture=True,
            isolate_ports=True,
            timeout=spec.get("timeout-seconds", 3600),
            on_line=progress.start_run(label, rounds_of(run)),
            ray_address=ray_address,
        )
    finally:
        progress.end_run()
    keep_server_log(run, before, result.output)
    existing = finished_run_dir(run)
    if result.returncode != 0 or existing is None:
        print(f"{label}: FAILED ({result.status}); last output:\n{result.output[-2000:]}",
              flush=True)
        return None
    record_provenance(existing, {**app_config(), **run.run_config},
                      "resumed" if partial is not None else "ran", code)
    records = read_rounds(existing)
    print(f"{label}: done in {time.monotonic() - start:.0f} s, final accuracy "
          f"{records[-1]['accuracy']:.4f}", flush=True)
    return existing


def run_dirs(folder: Path) -> set[Path]:
    """The run directories in ``folder`` (a variant's ``seed<k>`` folder) now."""
    return {p for p in folder.iterdir() if p.is_dir()} if folder.is_dir() else set()


def keep_server_log(run: SweepRun, before: set[Path], output: str) -> Path | None:
    """Write a run's streamed output as ``server.log`` into the run directory it made (the
    newest new one), or, when it made none (it stopped before), as
    ``server-<time>.log`` beside them; the path, or None when it could not be written."""
    made = sorted(run_dirs(run.directory) - before, key=lambda p: p.stat().st_mtime_ns)
    path = (made[-1] / SERVER_LOG if made else
            run.directory / f"server-{time.strftime('%Y%m%d-%H%M%S')}.log")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(output)
    except OSError as exc:
        print(f"{run.variant} seed {run.seed}: {path} not written: {exc}", flush=True)
        return None
    return path


def summarize(done: list[tuple[SweepRun, Path]]) -> list[dict]:
    """Final and best accuracy per variant, mean and std over seeds."""
    by_variant: dict[str, list[list[dict]]] = {}
    for run, directory in done:
        by_variant.setdefault(run.variant, []).append(read_rounds(directory))
    rows = []
    for variant, runs in by_variant.items():
        finals = [records[-1][C.LOG_ACCURACY] for records in runs]
        bests = [max(r[C.LOG_ACCURACY] for r in evaluated(records)) for records in runs]
        rows.append(
            {
                "variant": variant,
                "seeds": len(runs),
                "final-mean": statistics.mean(finals),
                "final-std": _std(finals),
                "best-mean": statistics.mean(bests),
                "best-std": _std(bests),
            }
        )
    return rows


def _std(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def write_summary(rows: list[dict], out: Path, spec: dict) -> str:
    """summary.csv + summary.md; returns the Markdown table."""
    with (out / "summary.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]) if rows else ["variant"])
        writer.writeheader()
        writer.writerows(rows)
    lines = ["| variant | seeds | final accuracy | best accuracy |", "|---|---|---|---|"]
    for row in rows:
        lines.append(
            f"| {row['variant']} | {row['seeds']} | {percent_over_seeds(row, 'final')} | "
            f"{percent_over_seeds(row, 'best')} |"
        )
    table = "\n".join(lines)
    header = f"# {spec.get('title', 'sweep')}\n\n{spec.get('claim', '')}\n\n"
    (out / "summary.md").write_text(header + table + "\n")
    return table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The sweep options."""
    parser.add_argument(
        "file",
        type=Path,
        help="sweep file (TOML), e.g. simulation/experiments/fedprox_stragglers.toml",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="results folder (default: runs/<file stem>)"
    )
    parser.add_argument(
        "--ray-address",
        type=ray_address,
        default=None,
        metavar="HOST:PORT",
        help="run the ClientApps on this Ray cluster (its head's GCS address) instead of "
        "a private Ray on this machine; docs/simulation.md: 'Running on a Ray cluster'",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=None,
        help="run only these of the file's seeds (e.g. --seeds 0 for one seed of every variant "
        "first; a later run without --seeds adds the rest)",
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        default=None,
        metavar="PATTERN",
        help="run only the variants matching one of these shell-style patterns "
        "(e.g. --variants 'dir0.5-*' c2-fedavg); the summary covers those",
    )


def nothing_selected(path: Path, spec: dict, seeds: list[int] | None,
                     variants: list[str] | None) -> str:
    """Why ``--seeds`` / ``--variants`` selected no run: the filters, and what the file has."""
    given = " ".join(([f"--seeds {' '.join(map(str, seeds))}"] if seeds is not None else [])
                     + ([f"--variants {' '.join(variants)}"] if variants is not None else []))
    file_seeds = sorted({seed for overrides in spec["variants"].values()
                         for seed in overrides.get("seeds", spec["seeds"])})
    return (f"{path}: {given or 'the file'} selects no run; the file has the variants "
            f"{', '.join(spec['variants']) or '(none)'} and the seeds "
            f"{', '.join(map(str, file_seeds)) or '(none)'}")


def run(args: argparse.Namespace) -> int:
    """Run the sweep, write its summary; 0 if every run finished."""
    try:
        spec = load_sweep(args.file)
    except (OSError, ValueError) as exc:  # a missing or bad sweep file: its message, no traceback
        raise SystemExit(f"sweep: {exc}") from None
    resources = federation(spec, args.file)
    try:  # ClientApps that no Ray on this machine could start: before any run or folder
        refuse_unfittable(resources, args.ray_address)
    except FederationConfigError as exc:
        raise SystemExit(f"sweep: {args.file}: {exc}") from None
    note = unused_gpus_note(resources, args.ray_address)
    if note:
        print(note, file=sys.stderr, flush=True)
    out = (args.out or Path("runs") / args.file.stem).resolve()
    every = {name: {"values": {}} for name in spec["variants"]} if "tuning" in spec else None
    selected = plan(spec, out, args.seeds, args.variants, every)  # tuned or not
    if not selected:
        raise SystemExit(nothing_selected(args.file, spec, args.seeds, args.variants))
    out.mkdir(parents=True, exist_ok=True)
    (out / SWEEP_COPY).write_text(Path(args.file).read_text())  # for the report: title, targets
    done = execute(spec, out, ray_address=args.ray_address, seeds=args.seeds,
                   variants=args.variants)
    table = write_summary(summarize(done), out, spec)
    print(f"\n{spec.get('title', '')}\n{table}\n\nResults: {out}")
    return 0 if len(done) == len(selected) else 1
