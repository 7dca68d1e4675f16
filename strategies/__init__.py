"""fedhetero strategies: heterogeneity-aware Flower strategies (flwr + numpy only).

Server strategies: :class:`FedAvg`, :class:`FedProx`, :class:`FedNova`, :class:`FedVeca`,
:class:`DynamicFL`, :class:`Scaffold`, :class:`FedDyn`, :class:`Moon`; asynchronous:
:class:`FedBuff`, :class:`FedAsync`; width-heterogeneous sub-models: :class:`HeteroFL`,
:class:`FjORD`, :class:`FedRolex`. A strategy whose contract the clients do not
implement stops the run with a :class:`ClientContractError` naming the
``strategies.client`` helper to call. Each takes Flower's FedAvg constructor arguments,
positional in Flower's order (:mod:`strategies.engine.flower_args`); each is the round engine
(:mod:`strategies.engine`) running one algorithm (:mod:`strategies.algorithms`). Flower's own server
optimisers, behind the trust gate and with a ``state_dict`` for checkpoints:
:class:`FedAdam`, :class:`FedYogi`, :class:`FedAdagrad`, :class:`FedAvgM`
(:mod:`strategies.algorithms.flower_optimizers`). Client selection
policies for any strategy's participation model: :class:`RandomSelection` (default),
:class:`OortSelection`, :class:`PowerOfChoice`, :class:`TiFLSelection`, with the
:class:`FleetGuard` that bounds what clients report about themselves; the simulated clock
that Oort, TiFL, deadlines and FedBuff's arrival order use: :class:`SimClock` over a
:class:`GeneratedFleet`, a :class:`FlashFleet` (FLASH's measured smartphones and networks)
or a :class:`TraceFleet` of :class:`DeviceProfile`. Byzantine-robust
aggregation for the FedAvg family and FedBuff (``robust=``): :class:`Median`,
:class:`TrimmedMean` (Yin et al. 2018, :mod:`strategies.engine.robust`).
"""

from .algorithms import *  # noqa: F403 - every algorithm's strategy (algorithms.__all__)
from .algorithms import __all__ as ALGORITHMS
from .engine.clock import SimClock
from .engine.devices import DeviceProfile, GeneratedFleet, TraceFleet
from .engine.flash_fleet import FlashFleet
from .engine.participation import STRAGGLER_POLICIES, STRAGGLER_UNITS, RandomSelection
from .engine.records import ClientContractError
from .engine.robust import ROBUST_RULES, Median, RobustRule, TrimmedMean
from .engine.round_engine import WEIGHTINGS
from .selection.fleet_guard import FleetGuard
from .selection.oort import OortSelection
from .selection.policy import SELECTIONS
from .selection.power_of_choice import PowerOfChoice
from .selection.tifl import TiFLSelection

__all__ = [*ALGORITHMS, "ClientContractError", "DeviceProfile", "FlashFleet", "FleetGuard",
           "GeneratedFleet",
           "Median", "SimClock", "TraceFleet", "OortSelection", "PowerOfChoice",
           "ROBUST_RULES", "RandomSelection", "RobustRule", "SELECTIONS", "STRAGGLER_POLICIES",
           "STRAGGLER_UNITS", "TiFLSelection", "TrimmedMean", "WEIGHTINGS"]
