"""``final_model.pt``: the final global model as a torch state dict.

Written atomically and fsynced with its folder (:mod:`fedapp.atomic_file`); read back with
``torch.load(..., weights_only=True)``, which builds tensors and plain containers only and
never runs code from the file. Imports neither flwr nor the strategies (the evaluation
process, fedapp.evaluation_process, writes it); torch is imported when a model is.
"""

from __future__ import annotations

from pathlib import Path

from .atomic_file import write_atomically

MODEL_NAME = "final_model.pt"


def write_model(state_dict: dict, path: Path) -> Path:
    """``torch.save`` ``state_dict`` to ``path`` atomically (temp file, fsync, rename, fsync
    of the folder; no temp file left if it fails)."""
    import torch  # noqa: PLC0415 - torch only where a model is

    return write_atomically(Path(path), lambda handle: torch.save(state_dict, handle))


def read_model(path: Path) -> dict:
    """The state dict in ``path`` (``weights_only=True``: tensors and containers only)."""
    import torch  # noqa: PLC0415

    return torch.load(Path(path), map_location="cpu", weights_only=True)
