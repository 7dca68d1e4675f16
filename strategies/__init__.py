"""fedhetero strategies: heterogeneity-aware Flower strategies (flwr + numpy only)."""

from .fedavg import WEIGHTINGS, FedAvg

__all__ = ["FedAvg", "WEIGHTINGS"]
