"""A run that learns nothing: its test accuracy stays at chance.

:class:`ChanceWatch` follows the evaluated rounds after round 0; when
:data:`EVALUATIONS` of them in a row are within :data:`MARGIN` of chance (1 / classes), it
says so once, with the likely cause (:func:`chance_cause`). Round 0 (the initial model) is
at chance by construction and is not counted.
"""

from __future__ import annotations

from collections.abc import Mapping

from strategies import contract as C

EVALUATIONS = 3
MARGIN = 0.02  # accuracy points above 1 / classes that still count as chance
WIDTH_STRATEGIES = frozenset({"heterofl", "fjord", "fedrolex"})


def chance_cause(strategy: str, lr: float, width_scaler: str = "auto") -> str:
    """What most likely keeps a ``strategy`` run at chance, and what to try."""
    causes = []
    if strategy in WIDTH_STRATEGIES and (width_scaler == "on" or (
            width_scaler == "auto" and strategy == "heterofl")):
        causes.append("HeteroFL's Scaler multiplies each scaled layer by 1/r, which compounds "
                      "without a normalisation after it: try -c width-scaler='off' "
                      "(docs/strategies/width.md)")
    causes.append(f"the learning rate (lr = {lr:g}) is too high (the test loss grows) or too "
                  "low (it stays)")
    causes.append("the clients train too little per round (local-steps / local-epochs)")
    return "; or ".join(causes)


class ChanceWatch:
    """One warning when the test accuracy stays at chance (module docstring)."""

    def __init__(self, num_classes: int, cause: str = "") -> None:
        self.chance = 1.0 / max(int(num_classes), 1)
        self.cause = cause
        self.rounds: list[int] = []
        self.said = False

    def check(self, record: Mapping[str, object]) -> str | None:
        """The warning, the first time :data:`EVALUATIONS` evaluations in a row after round 0
        are at chance; None otherwise."""
        accuracy, server_round = record.get(C.LOG_ACCURACY), record.get(C.LOG_ROUND)
        if self.said or not isinstance(accuracy, (int, float)) or isinstance(accuracy, bool) \
                or not server_round:
            return None
        if accuracy > self.chance + MARGIN:
            self.rounds = []
            return None
        self.rounds.append(int(server_round))
        if len(self.rounds) < EVALUATIONS:
            return None
        self.said = True
        return (f"The run is at chance: test accuracy within {MARGIN:.0%} of 1/"
                f"{round(1 / self.chance)} = {self.chance:.3f} in rounds "
                f"{', '.join(map(str, self.rounds))}. Likely cause: {self.cause}")
