"""The model names the run config accepts (``task.models`` builds them).

A module of its own, without torch, so that checking a run config
(:mod:`fedapp.config`) imports no torch: a deployed SuperNode starts a new ClientApp
process for every message, and a client-info query needs no model.
"""

from __future__ import annotations

MODEL_NAMES: tuple[str, ...] = (
    "mlp-2nn",
    "cnn-mcmahan",
    "cnn-small",
    "lenet-gn",
    "cnn-fedveca",
    "resnet18-gn",
    "svm",
)
