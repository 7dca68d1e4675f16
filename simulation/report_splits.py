"""What a report's accuracies were measured on: the runs of a variant with ``evaluation-split =
"validation"`` (tuning runs) have validation accuracies, which the report marks and never sets
against a paper's test accuracies (docs/simulation.md, "Tuning on a validation split")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from .report_labels import run_config

VALIDATION = "validation"


def validation_variants(runs: Mapping[str, Sequence[tuple[Path, list]]]) -> list[str]:
    """The variants with a run evaluated on the validation split (a run from before the key
    was evaluated on the test split)."""
    return [variant for variant, items in runs.items()
            if any(run_config(run_dir).get("evaluation-split") == VALIDATION
                   for run_dir, _ in items)]


def split_note(runs: Mapping[str, Sequence[tuple[Path, list]]]) -> str:
    """The note above the report's tables when some variants are tuning runs (else "")."""
    tuned = validation_variants(runs)
    if not tuned:
        return ""
    return (f"Validation accuracy: {', '.join(tuned)} {'was' if len(tuned) == 1 else 'were'} "
            "evaluated on the validation split held out of the training data "
            "(evaluation-split = \"validation\", tuning runs), not on the test split: their "
            "accuracies choose settings and are not test results; report the chosen settings "
            "from runs with evaluation-split = \"test\".\n\n")


def refuse_published(runs: Mapping[str, Sequence[tuple[Path, list]]],
                     published: Mapping[str, float]) -> None:
    """SystemExit when a variant set against a published (test) accuracy is a tuning run."""
    tuned = [variant for variant in validation_variants(runs) if variant in published]
    if tuned:
        raise SystemExit(
            f"{', '.join(tuned)}: evaluated on the validation split (evaluation-split = "
            "\"validation\"), but the sweep's `published` sets it against a paper's test "
            "accuracy. Fix: run it with evaluation-split = \"test\" for the comparison, or "
            "leave it out of `published`")
