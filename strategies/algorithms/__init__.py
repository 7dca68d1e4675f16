"""One module per paper, its pure math beside it. Importing a module registers its strategy
by name (:func:`strategies.engine.registry.register`): the one line per algorithm below is
what adds it to the package and to the fedhetero app."""

from .fedavg import FedAvg  # noqa: I001 - the order is the app's order of strategy names
from .fedprox import FedProx
from .fednova import FedNova
from .fedveca import FedVeca
from .dynamicfl import DynamicFL
from .scaffold import Scaffold
from .feddyn import FedDyn
from .moon import Moon
from .heterofl import HeteroFL
from .fjord import FjORD
from .fedrolex import FedRolex
from .fedbuff import FedBuff
from .fedasync import FedAsync
from .flower_optimizers import FedAdagrad, FedAdam, FedAvgM, FedYogi
from .fedexp import FedExP
from .fedlc import FedLC

__all__ = sorted(name for name, value in dict(globals()).items() if isinstance(value, type))
