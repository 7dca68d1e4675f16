"""Experiments: ``*.toml`` sweep files (``python -m simulation sweep FILE``) and, beside
them, the drivers of papers whose protocol a sweep file cannot express (``fedveca/``)."""

from __future__ import annotations

from pathlib import Path

EXPERIMENTS_DIR = Path(__file__).resolve().parent


def sweep_files() -> list[Path]:
    """Every shipped sweep file, by name."""
    return sorted(EXPERIMENTS_DIR.glob("*.toml"))
