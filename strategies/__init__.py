"""fedhetero strategies: heterogeneity-aware Flower strategies (flwr + numpy only)."""

from .dynamicfl import DynamicFL
from .fedavg import STRAGGLER_POLICIES, WEIGHTINGS, FedAvg
from .fednova import FedNova
from .fedveca import FedVeca
from .fedprox import FedProx

__all__ = ["DynamicFL", "FedAvg", "FedNova", "FedProx", "FedVeca", "STRAGGLER_POLICIES", "WEIGHTINGS"]
