"""fedhetero strategies: heterogeneity-aware Flower strategies (flwr + numpy only).

Server strategies: :class:`FedAvg`, :class:`FedProx`, :class:`FedNova`, :class:`FedVeca`,
:class:`DynamicFL`, :class:`Scaffold`, :class:`FedDyn`, :class:`Moon`; asynchronous:
:class:`FedBuff`, :class:`FedAsync`; width-heterogeneous sub-models: :class:`HeteroFL`,
:class:`FjORD`, :class:`FedRolex`. A strategy whose contract the clients do not
implement stops the run with a :class:`ClientContractError` naming the
``strategies.client`` helper to call. Each takes Flower's FedAvg constructor arguments,
positional in Flower's order (:mod:`strategies.engine.flower_args`). Flower's own server
optimisers, behind the trust gate and with a ``state_dict`` for checkpoints:
:class:`FedAdam`, :class:`FedYogi`, :class:`FedAdagrad`, :class:`FedAvgM`
(:mod:`strategies.algorithms.flower_optimizers`). Client selection
policies for any strategy's participation model: :class:`RandomSelection` (default),
:class:`OortSelection`, :class:`PowerOfChoice`, :class:`TiFLSelection`.
"""

from .algorithms.dynamicfl import DynamicFL
from .algorithms.fedasync import FedAsync
from .algorithms.fedavg import FedAvg
from .engine.participation import STRAGGLER_POLICIES, STRAGGLER_UNITS
from .engine.round_engine import WEIGHTINGS
from .algorithms.fedbuff import FedBuff
from .algorithms.feddyn import FedDyn
from .algorithms.fednova import FedNova
from .algorithms.fedprox import FedProx
from .algorithms.fedrolex import FedRolex
from .algorithms.fjord import FjORD
from .algorithms.heterofl import HeteroFL
from .algorithms.fedveca import FedVeca
from .algorithms.moon import Moon
from .engine.records import ClientContractError
from .engine.participation import RandomSelection
from .algorithms.scaffold import Scaffold
from .algorithms.flower_optimizers import FedAdagrad, FedAdam, FedAvgM, FedYogi
from .selection.policy import SELECTIONS
from .selection.oort import OortSelection
from .selection.power_of_choice import PowerOfChoice
from .selection.tifl import TiFLSelection

__all__ = ["ClientContractError", "DynamicFL", "FedAdagrad", "FedAdam", "FedAsync", "FedAvg",
           "FedAvgM", "FedBuff", "FedDyn", "FedNova", "FedProx", "FedRolex", "FedVeca", "FedYogi",
           "FjORD", "HeteroFL", "Moon", "OortSelection", "PowerOfChoice",
           "RandomSelection", "SELECTIONS", "STRAGGLER_POLICIES", "STRAGGLER_UNITS",
           "Scaffold", "TiFLSelection", "WEIGHTINGS"]
