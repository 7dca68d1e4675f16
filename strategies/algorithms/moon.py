"""MOON (Li, He and Song, "Model-Contrastive Federated Learning", CVPR 2021, Algorithm 1).

The server is FedAvg's (Algorithm 1: w^{t+1} = sum_k |D^k| / |D| w_k^t over the parties that
replied, the ``examples`` weighting); what MOON adds is on the client, which minimises
Eq. (4), l_sup + mu l_con, with Eq. (3)'s model-contrastive loss between the representation
of its local model, of the received global model and of its previous local model
(:class:`strategies.client.moon.MoonClient`). The server sends mu and tau, and keeps a copy
of each client's previous local model (the last model it accepted from that client), so
that it survives a resumed run, a lost reply and a SuperNode restart
(:mod:`strategies.engine.client_states`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import contract as C
from ..contract import Section, logged
from ..engine import records
from ..engine.algorithm import Algorithm, Contract, Outgoing, RoundInput, RoundUpdate
from ..engine.keys import Key, above, at_least
from ..engine.registry import register
from ..engine.round_engine import RoundEngine
from ..engine.round_plan import RoundPlan

__all__ = ["MOON_HELPER", "ModelContrastive", "Moon"]

MOON_HELPER = "strategies.client.MoonClient"


@dataclass(frozen=True)
class MoonSection(Section):
    """The num-examples-weighted mean contrastive loss (Li, He and Song 2021, Eq. 3)."""

    contrastive_loss: float | None = logged(C.LOG_MOON_CONTRASTIVE_LOSS)


class ModelContrastive(Algorithm):
    """MOON's algorithm: mu and tau beside the model, FedAvg's update, each accepted model
    its client's previous model (the engine's client-state copy)."""

    name = "MOON"
    contract = Contract(helper=MOON_HELPER, client_state="required")

    def __init__(self, mu: float = 1.0, temperature: float = 0.5) -> None:
        if not mu >= 0:
            raise ValueError(f"MOON's mu must be >= 0, got {mu}")
        if not temperature > 0:
            raise ValueError(f"MOON's temperature tau must be > 0, got {temperature}")
        self.mu, self.temperature = float(mu), float(temperature)

    def send(self, plan: RoundPlan) -> Outgoing:
        """mu of Eq. (4) and tau of Eq. (3), to every client."""
        return Outgoing(common={C.MOON_MU: self.mu, C.MOON_TEMPERATURE: self.temperature})

    def update(self, r: RoundInput) -> RoundUpdate:
        """Algorithm 1's weighted average; each accepted reply's model becomes its client's
        previous model; the mean contrastive loss the clients report."""
        new, used = r.average()
        metrics = records.mean_metrics([r.replies[k] for k in used])
        sections = ([MoonSection(float(metrics[C.MOON_CONTRASTIVE_LOSS]))]
                    if C.MOON_CONTRASTIVE_LOSS in metrics else [])
        return RoundUpdate(new, used, [r.models[k][1] for k in used], sections)


class Moon(RoundEngine):
    """MOON: FedAvg's server, clients trained with the model-contrastive loss.

    Parameters
    ----------
    mu : float
        mu >= 0, the weight of l_con in Eq. (4) (the authors' code default 1; the paper
        tunes {0.1, 1, 5, 10}: 5 is best on CIFAR-10, 1 on CIFAR-100 and Tiny-ImageNet).
        0 is FedAvg on the same model.
    temperature : float
        tau > 0 of Eq. (3) (the paper's default 0.5).
    **kwargs
        As :class:`FedAvg` (``weighting`` ``"examples"`` by default = Algorithm 1's
        |D^k| / |D|, ``fraction_train``, ``server_lr``, stragglers, ...).

    Notes
    -----
    The previous local model w_i^{t-1} is the client's model after its last local training
    (the paper: "MOON only needs the latest local model that the party has"). A client
    without one (its first round) trains with l_sup only, as the authors' code does in
    round 1 (its pool of previous models is empty, so l_con = 0); the code's later
    random-initialised "previous" models of parties never selected are an artefact of its
    simulation, and such a party here also trains with l_sup only.

    Memory: the server keeps one whole model per client that has replied (its last accepted
    reply), in memory and in every checkpoint, and sends it again (``bytes-down``) only
    when the node may not hold it (after a resume, a lost reply, a new node id).

    The model must expose its representation R_w(x) (the projection head's output, Sec.
    3.3.1): :mod:`strategies.client.moon` says how.

    Contract
    --------
    Server -> client: ``arrays`` (w^t), config ``moon-mu``, ``moon-temperature`` and
    ``state-round``, and ArrayRecord ``client-state`` (the server's copy of the previous
    local model) when attached. Client -> server: ``arrays`` (w_i^t), metrics
    ``num-examples``, ``state-round`` / ``state-digest`` of the previous model it used, and
    ``moon-contrastive-loss`` (optional, logged). :class:`strategies.client.moon.MoonClient`
    does all of it; a round in which every reply lacks the echo stops the run with a
    ClientContractError naming it.
    """

    def __init__(self, *flower_args, mu: float = 1.0, temperature: float = 0.5,
                 **kwargs) -> None:
        super().__init__(*flower_args, algorithm=ModelContrastive(mu, temperature), **kwargs)


KEYS = (Key("moon-mu", 1.0,
            "MOON's μ, the weight of the contrastive loss in ℓ_sup + μ ℓ_con (Eq. 4; 1 is the "
            "authors' code default, the paper tunes {0.1, 1, 5, 10}: 5 best on CIFAR-10, 1 on "
            "CIFAR-100); 0 = FedAvg on the same model", interval=at_least(0.0), arg="mu"),
        Key("moon-temperature", 0.5, "MOON's temperature τ of Eq. 3 (the paper's default)",
            interval=above(0.0), arg="temperature"))
register("moon", Moon, "MOON (Li, He and Song 2021, Alg. 1): model-contrastive loss (client "
         "helper, a representation model)", keys=KEYS, model="representation",
         client_side="strategies.client.moon",
         only=(("server-momentum", (0.0,), "MOON's server is FedAvg's weighted average, "
                "Alg. 1"),))
