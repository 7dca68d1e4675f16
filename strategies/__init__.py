"""fedhetero strategies: heterogeneity-aware Flower strategies (flwr + numpy only).

Server strategies: :class:`FedAvg`, :class:`FedProx`, :class:`FedNova`, :class:`FedVeca`,
:class:`DynamicFL`, :class:`Scaffold`, :class:`FedDyn`, :class:`Moon`; asynchronous:
:class:`FedBuff`, :class:`FedAsync`. A strategy whose contract the clients do not
implement stops the run with a :class:`ClientContractError` naming the
``strategies.client`` helper to call. Flower's own server optimisers with a
``state_dict`` for checkpoints: :mod:`strategies.server_optimizers`.
"""

from .dynamicfl import DynamicFL
from .fedasync import FedAsync
from .fedavg import STRAGGLER_POLICIES, STRAGGLER_UNITS, WEIGHTINGS, FedAvg
from .fedbuff import FedBuff
from .feddyn import FedDyn
from .fednova import FedNova
from .fedprox import FedProx
from .fedveca import FedVeca
from .moon import Moon
from .records import ClientContractError
from .scaffold import Scaffold

__all__ = ["ClientContractError", "DynamicFL", "FedAsync", "FedAvg", "FedBuff", "FedDyn",
           "FedNova", "FedProx", "FedVeca", "Moon", "STRAGGLER_POLICIES", "STRAGGLER_UNITS",
           "Scaffold", "WEIGHTINGS"]
