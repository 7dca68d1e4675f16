"""fedhetero strategies: heterogeneity-aware Flower strategies (flwr + numpy only).

Server strategies: :class:`FedAvg`, :class:`FedProx`, :class:`FedNova`, :class:`FedVeca`,
:class:`DynamicFL`, :class:`Scaffold`, :class:`FedDyn`, :class:`Moon`; asynchronous:
:class:`FedBuff`, :class:`FedAsync`; width-heterogeneous sub-models: :class:`HeteroFL`,
:class:`FjORD`, :class:`FedRolex`. A strategy whose contract the clients do not
implement stops the run with a :class:`ClientContractError` naming the
``strategies.client`` helper to call. Each takes Flower's FedAvg constructor arguments,
positional in Flower's order (:mod:`strategies.flower_args`). Flower's own server
optimisers, behind the trust gate and with a ``state_dict`` for checkpoints:
:class:`FedAdam`, :class:`FedYogi`, :class:`FedAdagrad`, :class:`FedAvgM`
(:mod:`strategies.server_optimizers`). Client selection
policies for any strategy's participation model: :class:`RandomSelection` (default),
:class:`OortSelection`, :class:`PowerOfChoice`, :class:`TiFLSelection`.
"""

from .dynamicfl import DynamicFL
from .fedasync import FedAsync
from .fedavg import STRAGGLER_POLICIES, STRAGGLER_UNITS, WEIGHTINGS, FedAvg
from .fedbuff import FedBuff
from .feddyn import FedDyn
from .fednova import FedNova
from .fedprox import FedProx
from .fedrolex import FedRolex
from .fjord import FjORD
from .heterofl import HeteroFL
from .fedveca import FedVeca
from .moon import Moon
from .records import ClientContractError
from .participation import RandomSelection
from .scaffold import Scaffold
from .server_optimizers import FedAdagrad, FedAdam, FedAvgM, FedYogi
from .selection import SELECTIONS
from .selection_oort import OortSelection
from .selection_power_of_choice import PowerOfChoice
from .selection_tifl import TiFLSelection

__all__ = ["ClientContractError", "DynamicFL", "FedAdagrad", "FedAdam", "FedAsync", "FedAvg",
           "FedAvgM", "FedBuff", "FedDyn", "FedNova", "FedProx", "FedRolex", "FedVeca", "FedYogi",
           "FjORD", "HeteroFL", "Moon", "OortSelection", "PowerOfChoice",
           "RandomSelection", "SELECTIONS", "STRAGGLER_POLICIES", "STRAGGLER_UNITS",
           "Scaffold", "TiFLSelection", "WEIGHTINGS"]
