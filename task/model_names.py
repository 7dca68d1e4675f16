"""The model names the run config accepts (``task.models`` builds them).

A module of its own, without torch, so that checking a run config
(:mod:`fedapp.config`) imports no torch: a deployed SuperNode starts a new ClientApp
process for every message, and a client-info query needs no model.
"""

from __future__ import annotations

MODEL_NAMES: tuple[str, ...] = (
    "mlp-2nn",
    "mlp-2nn-moon",
    "cnn-mcmahan",
    "cnn-small",
    "cnn-small-moon",
    "lenet-gn",
    "cnn-fedveca",
    "resnet18-gn",
    "svm",
)

# models that scale in width: ``build_model(name, ..., width=r)``, ``width_spec(name, ...)``
WIDTH_MODELS: tuple[str, ...] = ("mlp-2nn", "cnn-small", "resnet18-gn")

# models with ``forward_with_representation(x) -> (logits, z)``: what MOON needs
REPRESENTATION_MODELS: tuple[str, ...] = ("cnn-small-moon", "mlp-2nn-moon")
