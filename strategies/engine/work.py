"""A client's local work as the participation model plans and the clock charges it.

:class:`LocalWork` is the :class:`~strategies.engine.participation.ClientWork` the engine
gives the participation model: tau_i and b_i from the task's config and the client's facts
(``local-steps``, else floor(E n_i / B)), no extra examples, the model each way plus the
records the algorithm's contract sends and expects, and each client's own sub-model on the
clock. An algorithm whose paper sets the work itself (FedVeca's adaptive tau) gives the
engine its :class:`WorkRules`.
"""

from __future__ import annotations

from typing import Protocol

from flwr.app import ArrayRecord, ConfigRecord

from .algorithm import Contract
from .participation import ModelShare, Participation
from .records import ClientInfo

__all__ = ["LocalWork", "WorkRules"]


class WorkRules(Protocol):
    """An algorithm's own rules for a client's local work (FedVeca's)."""

    min_partial_steps: int
    """Fewest local steps a deadline straggler is sent; fewer fit: it gets no work."""

    def full_local_steps(self, key: str, info: ClientInfo, config: ConfigRecord) -> int:
        """tau_i of client ``key`` (its facts ``info``) when it is not a straggler."""

    def examples_per_step(self, key: str, info: ClientInfo, config: ConfigRecord,
                          plain: int) -> int:
        """b_i, examples per local step; ``plain`` is the plain rule's."""

    def extra_examples(self, key: str, info: ClientInfo, config: ConfigRecord) -> int:
        """e_i, examples of forward-backward passes beyond the local steps."""


class LocalWork:
    """:class:`~strategies.engine.participation.ClientWork` of a strategy (module docstring)."""

    def __init__(self, participation: Participation, contract: Contract,
                 rules: WorkRules | None = None, submodels=None, owner: str = "FedAvg") -> None:
        self.participation, self.contract, self.rules = participation, contract, rules
        self.submodels, self.owner = submodels, owner
        self.min_partial_steps = rules.min_partial_steps if rules is not None else 1

    def client(self, node_id: int) -> tuple[str, ClientInfo]:
        """A node's client key and facts, as the algorithm's rules take them."""
        p = self.participation
        return p.client_key(node_id), p.info(node_id)

    def full_local_steps(self, node_id: int, config: ConfigRecord) -> int:
        """tau_i of a non-straggler: the algorithm's rule, else ``local-steps`` if set, else
        floor(E n_i / B)."""
        if self.rules is not None:
            return self.rules.full_local_steps(*self.client(node_id), config)
        return self.participation.full_local_steps(node_id, config)

    def examples_per_step(self, node_id: int, config: ConfigRecord) -> int:
        """b_i = min(B, n_i) examples per local step; n_i for a full batch (B = 0)."""
        plain = self.participation.examples_per_step(node_id, config, self.owner)
        if self.rules is not None:
            return self.rules.examples_per_step(*self.client(node_id), config, plain)
        return plain

    def extra_examples(self, node_id: int, config: ConfigRecord) -> int:
        """e_i of :mod:`strategies.engine.clock` eq. (1): the algorithm's, else none."""
        if self.rules is None:
            return 0
        return self.rules.extra_examples(*self.client(node_id), config)

    def expected_bytes(self, arrays: ArrayRecord) -> tuple[int, int]:
        """Bytes down and up per client as the clock plans them: the model each way, plus
        the contract's records."""
        size = arrays.count_bytes()
        down, up = self.contract.extra_bytes(arrays)
        return size + down, size + up

    def model_share(self, node_id: int, config: ConfigRecord, down: int, up: int
                    ) -> ModelShare:
        """The model a client trains on the clock: its sub-model, else the full one."""
        if self.submodels is not None:
            return self.submodels.model_share(node_id, config, self)
        return ModelShare(1.0, down, up)
