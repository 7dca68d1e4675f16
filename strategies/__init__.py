"""fedhetero strategies: heterogeneity-aware Flower strategies (flwr + numpy only)."""

from .fedavg import STRAGGLER_POLICIES, WEIGHTINGS, FedAvg
from .fednova import FedNova
from .fedprox import FedProx

__all__ = ["FedAvg", "FedNova", "FedProx", "STRAGGLER_POLICIES", "WEIGHTINGS"]
