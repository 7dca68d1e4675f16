"""An experiment adds at most 1 MiB to the repository (issue #56): its archived run logs
(``docs/results/run-logs/<experiment>/``) plus its page (``docs/results/<experiment>/`` and
``docs/results/<experiment>.md``)."""

from __future__ import annotations

from pathlib import Path

from simulation.archive_logs import EXPERIMENT_LIMIT
from simulation.experiments import fedveca, sweep_files

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
RUN_LOGS = RESULTS / "run-logs"
NOT_IN_GIT = ("*.pt",)  # docs/results/run-logs/**/*.pt is ignored (.gitignore)


def files_size(path: Path) -> int:
    """Bytes of the files at ``path`` that git keeps (a file, a folder's files, or 0)."""
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*")
               if f.is_file() and not any(f.match(p) for p in NOT_IN_GIT)) if path.is_dir() \
        else 0


def experiment_names() -> list[str]:
    """Every experiment: each sweep file, FedVeca's driver, each folder of archived logs."""
    return sorted({p.stem for p in sweep_files()} | {fedveca.NAME}
                  | {p.name for p in RUN_LOGS.iterdir() if p.is_dir()})


def test_every_experiment_adds_at_most_1_mib_to_the_repository():
    sizes = {name: (files_size(RUN_LOGS / name),
                    files_size(RESULTS / name) + files_size(RESULTS / f"{name}.md"))
             for name in experiment_names()}
    assert sizes["width_fmnist"][0] > 0  # the archive is where this test looks
    over = [name for name, (logs, page) in sizes.items() if logs + page > EXPERIMENT_LIMIT]
    table = "\n".join(f"{name}: logs {logs / 1024:.0f} KiB + page {page / 1024:.0f} KiB = "
                      f"{(logs + page) / 1024:.0f} KiB" for name, (logs, page) in sizes.items())
    assert not over, (f"{', '.join(over)} over the {EXPERIMENT_LIMIT // 1024} KiB an experiment "
                      "may add; archive fewer runs (python -m simulation archive-logs "
                      f"--variants/--seeds) or shrink the page:\n{table}")
