"""The shared PyTorch task: models, data, partitions, local solvers, evaluation.

Imports no Flower server code; used by the ClientApp, the ServerApp's evaluation,
and the simulation tooling.
"""
