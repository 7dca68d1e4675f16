"""What a round did, as typed records: the strategies' one output besides the model.

A round's :class:`RoundReport` is a list of sections, each a frozen dataclass whose fields
name their run-log key (:mod:`strategies.contract`, ``LOG_*``) in the field's metadata.
The participation model writes :class:`ParticipationSection` and :class:`ClockTime`, the
aggregation :class:`Aggregation` and :class:`Drift`, and each algorithm its own section
(``FedNovaSection`` beside FedNova in :mod:`strategies.algorithms.fednova`, ...). :meth:`RoundReport.log_record` is the round's record in the
run log (``rounds.jsonl``); :meth:`RoundReport.metric_items` its numbers, for Flower's
``MetricRecord``. No Flower types here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from logging import INFO

from flwr.common.logger import log

from .. import contract as C
from ..contract import Section, logged

__all__ = ["Aggregation", "AsyncUpdate", "ClientStateSection", "ClockTime", "Drift",
           "DropOut", "OverCommitment", "ParticipationSection", "RoundReport"]


@dataclass(frozen=True)
class ParticipationSection(Section):
    """Who was asked to train (the participation model's plan, sent)."""

    sampled: int = logged(C.LOG_CLIENTS_SAMPLED, default=0)
    stragglers: int = logged(C.LOG_CLIENTS_STRAGGLERS, default=0)
    dropped: int = logged(C.LOG_CLIENTS_DROPPED, default=0)
    bytes_down: int = logged(C.LOG_BYTES_DOWN, default=0)
    lr: float | None = logged(C.LOG_LR)
    unavailable: int | None = logged(C.LOG_CLIENTS_UNAVAILABLE)


@dataclass(frozen=True)
class Aggregation(Section):
    """What came back and went into the new global model."""

    received: int = logged(C.LOG_CLIENTS_RECEIVED, default=0)
    failed: int = logged(C.LOG_CLIENTS_FAILED, default=0)
    bytes_up: int = logged(C.LOG_BYTES_UP, default=0)
    local_steps: list[int] | None = logged(C.LOG_LOCAL_STEPS)
    train_loss: float | None = logged(C.LOG_TRAIN_LOSS)
    model_kept: bool = logged(C.LOG_MODEL_KEPT, default=False)


@dataclass(frozen=True)
class Drift(Section):
    """Client drift of the accepted updates (Hsieh et al., IID->non-IID study, Fig. 13)."""

    cosine: Mapping[str, float] | None = logged(C.LOG_DRIFT_COSINE)
    cosine_mean: float | None = logged(C.LOG_DRIFT_COSINE_MEAN)
    norm_mean: float | None = logged(C.LOG_UPDATE_NORM_MEAN)
    norm_cv: float | None = logged(C.LOG_UPDATE_NORM_CV)


@dataclass(frozen=True)
class ClockTime(Section):
    """The round on the simulated clock (:mod:`strategies.engine.clock`, eq. 1)."""

    seconds: float = logged(C.LOG_SIM_SECONDS, default=0.0)
    elapsed: float = logged(C.LOG_SIM_ELAPSED, default=0.0)
    wait: float | None = logged(C.LOG_SIM_WAIT_SECONDS)


@dataclass(frozen=True)
class AsyncUpdate(Section):
    """An asynchronous round: the server update and the client updates it applied
    (:mod:`strategies.algorithms.staleness`)."""

    staleness: list[int] = logged(C.LOG_STALENESS, default=())
    concurrency: int = logged(C.LOG_CONCURRENCY, default=0)
    buffer_fill: int = logged(C.LOG_BUFFER_FILL, default=0)
    client_updates: int = logged(C.LOG_CLIENT_UPDATES, default=0)
    model_version: int = logged(C.LOG_MODEL_VERSION, default=0)


@dataclass(frozen=True)
class OverCommitment(Section):
    """A round closed at its first m replies (:mod:`strategies.engine.participation`)."""

    late: int = logged(C.LOG_CLIENTS_LATE, default=0)


@dataclass(frozen=True)
class DropOut(Section):
    """The clients that dropped out before replying (the clock's ``dropout``): their replies
    are discarded (:mod:`strategies.engine.round_engine`)."""

    dropped_out: int = logged(C.LOG_CLIENTS_DROPPED_OUT, default=0)
    clients: list[str] = logged(C.LOG_DROPPED_OUT, default=())

    @classmethod
    def of(cls, server_round: int, keys: list[str]) -> DropOut:
        """The section of the clients ``keys`` (their keys in cross-round tables), with one
        log line when there are any."""
        if keys:
            log(INFO, "Round %d: %d client(s) dropped out before replying, their replies "
                "discarded: %s", server_round, len(keys), ", ".join(keys))
        return cls(len(keys), list(keys))


@dataclass(frozen=True)
class ClientStateSection(Section):
    """The server's copies of client state (:mod:`strategies.engine.client_states`)."""

    attached: int | None = logged(C.LOG_CLIENT_STATE_ATTACHED)
    rounds: list[int] | None = logged(C.LOG_CLIENT_STATE_ROUNDS)


@dataclass
class RoundReport:
    """Round ``server_round``'s sections, in the order they were added."""

    server_round: int
    sections: list[Section] = field(default_factory=list)

    def add(self, section: Section) -> None:
        """Add a section; one of a type that is there already replaces it."""
        self.sections = [s for s in self.sections if type(s) is not type(section)]
        self.sections.append(section)

    def get(self, kind: type[Section]) -> Section | None:
        """The section of type ``kind``, or None."""
        return next((s for s in self.sections if type(s) is kind), None)

    def log_record(self) -> dict[str, object]:
        """The round's run-log items (later sections win a shared key)."""
        record: dict[str, object] = {}
        for section in self.sections:
            record.update(section.log_items())
        return record

    def metric_items(self) -> dict[str, float | int | list]:
        """The numbers of :meth:`log_record` as Flower's MetricRecord holds them: ints, finite
        floats and lists of them (bools as 0 / 1); dicts, strings and None left out."""
        items: dict[str, float | int | list] = {}
        for key, value in self.log_record().items():
            if isinstance(value, bool):
                items[key] = int(value)
            elif _number(value):
                items[key] = value
            elif (isinstance(value, (list, tuple)) and value
                  and all(_number(v) for v in value)
                  and len({type(v) for v in value}) == 1):
                items[key] = list(value)
        return items


def _number(value: object) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or (
        isinstance(value, float) and math.isfinite(value))
