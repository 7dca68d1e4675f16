"""Tuning before the seeds run: every variant of a sweep file gets the same number of runs
on one seed, scored on a validation split carved out of the training data, and its seeds
then run with the point that scored best (the test set never tunes).

A sweep file's ``[tuning]`` table::

    [tuning]
    seed = 100                          # the one seed every tuning run uses
    grid = { lr = [0.02, 0.05, 0.1] }   # every variant's grid

and a variant's own knob, in its table: ``tune = { proximal-mu = [0.001, 0.01, 0.1] }``
(its values are crossed with the grid; a key in both takes the variant's list). Equal
budget: every variant's grid has the same number of points, or the sweep refuses the file
(give a variant without a knob a finer grid). Each tuning run is the variant's run config
with the point's values, the tuning seed and :data:`VALIDATION` (the server evaluates on the
held-out part of the training set, which no client trains on); it writes to
``<out>/tuning/<variant>/<point>/seed<seed>/``. The score is the mean validation accuracy of
the last 10 evaluations (:func:`simulation.metrics.last_mean`); the best point (the first in
grid order on a tie) is written to ``<out>/tuning/chosen.json`` with every score.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fedapp.config import toml_value
from fedapp.run_log import read_rounds

from .metrics import last_mean

TUNING_FOLDER = "tuning"
CHOSEN = "chosen.json"
TUNING_KEYS = ("seed", "grid")
VALIDATION = {"evaluation-split": "validation"}  # fedapp.config_keys: the held-out split


@dataclass(frozen=True)
class TuningRun:
    """One point of one variant's grid."""

    variant: str
    point: str  # folder name, e.g. "lr=0.05+proximal-mu=0.01"
    values: dict = field(compare=False, hash=False)
    directory: Path = field(default=Path())


def tuning_of(spec: Mapping, path: Path | str = "sweep file") -> dict | None:
    """The checked ``[tuning]`` table, or None when the file has none (ValueError naming the
    key and the fix)."""
    table = spec.get("tuning")
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ValueError(f"{path}: 'tuning' must be a table ([tuning])")
    unknown = sorted(set(table) - set(TUNING_KEYS))
    if unknown:
        raise ValueError(f"{path}: [tuning] has unknown key(s) {unknown}; it has "
                         f"{', '.join(TUNING_KEYS)}")
    seed = table.get("seed")
    if not (isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0):
        raise ValueError(f"{path}: [tuning] seed = {seed!r}: give the one seed of the tuning "
                         "runs, an int >= 0 (e.g. seed = 100, apart from the reported seeds)")
    if TUNING_FOLDER in spec.get("variants", {}):
        raise ValueError(f"{path}: a variant named {TUNING_FOLDER!r} would share the tuning "
                         "runs' folder; rename it")
    _grid(table.get("grid", {}), f"{path}: [tuning] grid")
    sizes = {name: len(points(spec, name, path)) for name in spec.get("variants", {})}
    if len(set(sizes.values())) > 1:
        raise ValueError(f"{path}: tuning budgets differ: " + ", ".join(
            f"{name} {n} runs" for name, n in sizes.items()) + "; every variant gets the same "
            "number of tuning runs (give the variants without a `tune` knob a finer lr grid)")
    return table


def _grid(grid: object, where: str) -> dict[str, list]:
    if not isinstance(grid, dict):
        raise ValueError(f"{where} must be a table of run-config key = [values]")
    for key, values in grid.items():
        if not (isinstance(values, list) and values):
            raise ValueError(f"{where}: {key} = {values!r} must be a non-empty list of values")
        if len(set(map(repr, values))) != len(values):
            raise ValueError(f"{where}: {key} lists a value twice: {values!r}")
    return grid


def points(spec: Mapping, variant: str, path: Path | str = "sweep file") -> list[dict]:
    """The variant's tuning points in grid order: ``[tuning] grid`` crossed with its ``tune``."""
    grid = dict(_grid(spec.get("tuning", {}).get("grid", {}), f"{path}: [tuning] grid"))
    grid.update(_grid(spec["variants"][variant].get("tune", {}),
                      f"{path}: variant {variant!r} tune"))
    if not grid:
        raise ValueError(f"{path}: [tuning] has no grid and variant {variant!r} no `tune`: "
                         "nothing to tune (e.g. grid = { lr = [0.02, 0.05, 0.1] })")
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def point_name(values: Mapping) -> str:
    """``lr=0.05+proximal-mu=0.01``: one folder name per point."""
    return "+".join(f"{key}={toml_value(value).strip(chr(34))}" for key, value in values.items())


def tuning_runs(spec: Mapping, out: Path, variants: list[str] | None = None) -> list[TuningRun]:
    """Every tuning run of the given variants (all: None), in file and grid order."""
    names = [v for v in spec["variants"] if variants is None or v in variants]
    seed = spec["tuning"]["seed"]
    return [TuningRun(name, point_name(values), values,
                      out / TUNING_FOLDER / name / point_name(values) / f"seed{seed}")
            for name in names for values in points(spec, name)]


def tuning_config(base: Mapping, run: TuningRun, seed: int) -> dict:
    """A tuning run's run config: the variant's with the point's values, the tuning seed,
    the validation split and its folder."""
    return {**base, **run.values, **VALIDATION, "seed": seed,
            "output-dir": str(run.directory.resolve())}


def choose(runs: list[TuningRun], finished: Mapping[TuningRun, Path], out: Path) -> dict:
    """variant -> {"values": the best point's values, "point": its name, "scores": point ->
    validation score}; written to ``<out>/tuning/chosen.json``. A variant whose tuning runs
    are not all finished is left out (its seeds cannot run yet)."""
    chosen: dict[str, dict] = {}
    for variant in dict.fromkeys(r.variant for r in runs):
        mine = [r for r in runs if r.variant == variant]
        if not all(r in finished for r in mine):
            continue
        scores = {r.point: last_mean(read_rounds(finished[r])) for r in mine}
        best = max(mine, key=lambda r: (scores[r.point], -mine.index(r)))
        chosen[variant] = {"values": best.values, "point": best.point, "scores": scores}
    folder = out / TUNING_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    previous = read_chosen(out)
    (folder / CHOSEN).write_text(json.dumps({**previous, **chosen}, indent=1, sort_keys=True)
                                 + "\n")
    return {**previous, **chosen}


def read_chosen(out: Path) -> dict:
    """``<out>/tuning/chosen.json`` ({} when there is none or it is unreadable, named)."""
    path = out / TUNING_FOLDER / CHOSEN
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ValueError("not an object")
        return data
    except (OSError, ValueError) as exc:
        print(f"{path}: unreadable ({exc}); the tuning choice is made again", flush=True)
        return {}
