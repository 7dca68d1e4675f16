"""Clients whose task timed out sit out the next rounds (a component of the participation
model).

A task without a reply by the round's timeout costs the whole timeout (Flower's
``round_timeout``, 3600 s by default) while the round waits for it; a client that went
silent once is likely to again, and drawing it at once makes the next round wait as long.
So a client whose task timed out sits out the next round, after a second silence in a row
the next 2, then 4, ..., at most :data:`MAX_ROUNDS_OUT`; any reply (an error reply too: it
answers) clears its record. Nobody sits out when that would leave fewer clients than the
round needs. The record is cross-round state: it goes into the participation model's
checkpointed state, so a resumed run draws as an uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["MAX_ROUNDS_OUT", "SilentClients"]

MAX_ROUNDS_OUT = 32


class SilentClients:
    """Per client key: silences in a row, and the last round it sits out."""

    def __init__(self) -> None:
        self.silences: dict[str, int] = {}
        self.out_until: dict[str, int] = {}

    def record(self, server_round: int, silent: Iterable[str], answered: Iterable[str]) -> None:
        """Round ``server_round``'s tasks: the clients without a reply, those with one."""
        for key in answered:
            self.silences.pop(key, None)
            self.out_until.pop(key, None)
        for key in silent:
            count = self.silences.get(key, 0) + 1
            self.silences[key] = count
            self.out_until[key] = server_round + min(2 ** (count - 1), MAX_ROUNDS_OUT)

    def sitting_out(self, server_round: int) -> set[str]:
        """The clients that sit round ``server_round`` out."""
        return {key for key, last in self.out_until.items() if server_round <= last}

    def state_dict(self) -> dict:
        return {"silences": dict(self.silences), "out-until": dict(self.out_until)}

    def load_state_dict(self, state: Mapping) -> None:
        self.silences = {str(k): int(v) for k, v in state["silences"].items()}
        self.out_until = {str(k): int(v) for k, v in state["out-until"].items()}
