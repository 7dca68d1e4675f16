"""FedVeca's fairness protocol (Luo et al., Sec. IV-A).

1. FedVeca runs first. tau_all = sum_k sum_i tau_(k,i) is the total number of local SGD
   steps over all clients and all K rounds (read from its ``rounds.jsonl``: the
   ``fedveca-tau`` dict of every round holds the steps each client ran).
2. FedAvg and FedNova get E_avg = (tau_all / K) * B / D local epochs, i.e. the fixed
   tau_i = floor(E_avg * D_i / B) every round (``local-epochs`` may be a fraction).
3. Centralized SGD takes tau_all minibatch steps of size B on the union of the clients'
   data (``simulation.experiments.fedveca.centralized``).

Pure functions, no Flower: the driver is ``simulation.experiments.fedveca.fig3``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from fedapp.run_log import log_path, read_json
from strategies import contract as C
from strategies.contract import steps_for_epochs


@dataclass(frozen=True)
class FedVecaBudget:
    """What FedVeca's run spent, and the baselines' local work derived from it."""

    rounds: int  # K: rounds with a fedveca-tau record
    tau_all: int  # sum over rounds and clients of the steps run
    per_round: list[int]  # sum_i tau_(k,i) of every round, k = 0..K-1
    batch_size: int  # B
    sizes: list[int]  # D_i by partition id
    e_avg: float  # (tau_all / K) * B / D
    baseline_taus: list[int]  # floor(E_avg D_i / B), at least 1, by partition id

    @property
    def baseline_steps_per_round(self) -> int:
        return sum(self.baseline_taus)

    def to_json(self) -> dict:
        return {**asdict(self), "total-examples": sum(self.sizes),
                "baseline-steps-per-round": self.baseline_steps_per_round,
                "fedveca-steps-per-round-mean": self.tau_all / self.rounds}


def steps_per_round(records: Sequence[dict]) -> list[int]:
    """sum_i tau_(k,i) of every FedVeca round that logged ``fedveca-tau``, in round order."""
    rows = sorted((r for r in records if r.get(C.LOG_FEDVECA_TAU)), key=lambda r: r[C.LOG_ROUND])
    return [sum(int(v) for v in r[C.LOG_FEDVECA_TAU].values()) for r in rows]


def e_avg(tau_all: int, rounds: int, batch_size: int, total_examples: int) -> float:
    """E_avg = (tau_all / K) * B / D (Luo et al., Sec. IV-A)."""
    if rounds < 1 or batch_size < 1 or total_examples < 1:
        raise ValueError(f"need K, B, D >= 1; got K={rounds}, B={batch_size}, D={total_examples}")
    return tau_all * batch_size / (rounds * total_examples)


def baseline_taus(sizes: Sequence[int], batch_size: int, epochs: float) -> list[int]:
    """tau_i = max(1, floor(E D_i / B)): what our clients run with ``local-epochs=E``."""
    return [steps_for_epochs(int(n), batch_size, epochs) for n in sizes]


def budget(records: Sequence[dict], sizes: Sequence[int], batch_size: int) -> FedVecaBudget:
    """The fairness protocol's numbers from a FedVeca run's round records."""
    per_round = steps_per_round(records)
    if not per_round:
        raise ValueError(f"no round carries '{C.LOG_FEDVECA_TAU}'; is this a FedVeca run log?")
    tau_all = sum(per_round)
    e = e_avg(tau_all, len(per_round), batch_size, sum(sizes))
    return FedVecaBudget(
        rounds=len(per_round),
        tau_all=tau_all,
        per_round=per_round,
        batch_size=batch_size,
        sizes=[int(n) for n in sizes],
        e_avg=e,
        baseline_taus=baseline_taus(sizes, batch_size, e),
    )


def partition_sizes(run_dir: Path) -> list[int] | None:
    """D_i by partition id from the ``partitions.json`` (label counts, or its archived
    ``partitions.json.xz``) a run wrote, if any."""
    if not log_path(run_dir, "partitions.json").is_file():
        return None
    counts = read_json(run_dir, "partitions.json")
    return [int(sum(counts[key])) for key in sorted(counts, key=int)]


def checkpoints(per_round: Sequence[int]) -> list[int]:
    """Cumulative steps after each round: centralized SGD is evaluated where it has done
    as many steps as FedVeca's clients together had by the end of that round."""
    out, total = [], 0
    for steps in per_round:
        total += int(steps)
        out.append(total)
    return out


def first_reach(
    records: Sequence[dict],
    target: float,
    key: str = C.LOG_ACCURACY,
    lower_is_better: bool = False,
    start_round: int = 1,
) -> int | None:
    """The first round r >= start_round whose ``key`` reaches ``target`` (>=, or <= for a
    loss); None when it never does. No interpolation: a round is reached or not."""
    for record in sorted(records, key=lambda r: r[C.LOG_ROUND]):
        value = record.get(key)
        if record[C.LOG_ROUND] < start_round or value is None:
            continue
        if (value <= target) if lower_is_better else (value >= target):
            return int(record[C.LOG_ROUND])
    return None
