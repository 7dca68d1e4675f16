"""A report's label-distribution pictures: one per partition setting among the compared
runs, never one picture for runs whose partitions differ.

A setting is what decides the clients' data: the dataset, the partition scheme and its keys,
the number of clients and the partition's seed (``partition-seed``, or ``seed`` at -1). Its
picture is drawn from a run's ``partitions.json`` (the clients' label counts), titled with
the setting, or else copied from its ``label_distribution.png``. A run without config.json
has an unknown setting: its seed folder (``seed<k>``) or its directory name stands for it.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from fedapp.run_log import read_json

from .preflight import SCHEME_KEYS
from .report_labels import SHORT_NAMES, Runs, in_sweep_layout, run_config, value_text

PARTITIONS = "partitions.json"
PICTURE = "label_distribution.png"


def label_counts(run_dir: Path) -> np.ndarray | None:
    """The (clients, classes) label counts of a run's partitions.json (or partitions.json.xz);
    None without one."""
    try:
        counts = read_json(run_dir, PARTITIONS)
        rows = [counts[k] for k in sorted(counts, key=int)]
        return np.asarray(rows, dtype=np.int64) if rows else None
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def partition_seed(config: Mapping) -> object:
    """The seed the partition was drawn with: ``partition-seed``, or ``seed`` at -1."""
    seed = config.get("partition-seed", -1)
    return config.get("seed") if seed == -1 else seed


def partition_setting(run_dir: Path) -> str:
    """"fashion-mnist, dirichlet alpha=0.1 min-partition-size=10, 20 clients, partition
    seed 0" (module docstring)."""
    config = run_config(run_dir)
    if not config:
        return run_dir.parent.name if in_sweep_layout(run_dir) else run_dir.name
    dataset = str(config.get("dataset", "?"))
    if dataset == "synthetic":
        dataset += f"({value_text(config.get('synthetic-alpha'))}, " \
            f"{value_text(config.get('synthetic-beta'))})"
    scheme = str(config.get("partition", "?"))
    scheme += "".join(f" {SHORT_NAMES.get(k, k)}={value_text(config[k])}"
                      for k in SCHEME_KEYS.get(scheme, ()) if k in config)
    if config.get("partition-map"):
        scheme += f" map={Path(str(config['partition-map'])).name}"
    parts = [dataset, scheme]
    counts = label_counts(run_dir)
    if counts is not None:
        parts.append(f"{len(counts)} clients")
    parts.append(f"partition seed {value_text(partition_seed(config))}")
    return ", ".join(parts)


def partition_groups(runs: Runs) -> dict[str, list[tuple[str, Path]]]:
    """partition setting -> [(variant, run directory)] of the runs drawn with it, in the
    order the runs come."""
    groups: dict[str, list[tuple[str, Path]]] = {}
    for variant, items in runs.items():
        for run_dir, _ in items:
            groups.setdefault(partition_setting(run_dir), []).append((variant, run_dir))
    return groups


def picture_name(setting: str) -> str:
    """label_distribution_<the setting, as a file name>.png."""
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", setting.replace("partition seed", "seed")).strip("-")
    return f"label_distribution_{slug[:120]}.png"


def write_pictures(runs: Runs, labels: Mapping[str, str], out: Path) -> str:
    """One picture per partition setting in ``out``; the markdown table that names each
    picture's setting and the variants drawn with it ("" when no run has one)."""
    from task.partition import plot_label_histogram  # noqa: PLC0415 - matplotlib

    lines = []
    for setting, members in partition_groups(runs).items():
        name = picture_name(setting)
        drawn = False
        for _, run_dir in members:
            counts = label_counts(run_dir)
            if counts is not None and counts.ndim == 2:
                plot_label_histogram(counts, out / name, title=setting)
                drawn = True
            elif (run_dir / PICTURE).is_file():
                shutil.copyfile(run_dir / PICTURE, out / name)
                drawn = True
            if drawn:
                break
        if drawn:
            variants = ", ".join(dict.fromkeys(labels.get(v, v) for v, _ in members))
            lines.append(f"| {name} | {setting} | {variants} |")
    if not lines:
        return ""
    return "\n".join(["| picture | partition | variants |", "|---|---|---|", *lines])
