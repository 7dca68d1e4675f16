"""``fedhetero run --quick``: any strategy in about a minute on 2 cores, a first look.

The app's defaults are a study's (10 SuperNodes, 2 local epochs: about 950 local steps per
client per round on Fashion-MNIST). The quick preset takes 4 SuperNodes, 10 rounds of 40
local steps (batch 32), evaluates on the test set with batches of 1,000 and gives the
asynchronous strategies one task in flight per SuperNode and a buffer (FedBuff) or a round
(FedAsync) of half of them. Keys the user gives with ``-c`` win; the note the launch prints
names what the preset set.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["QUICK", "QUICK_SUPERNODES", "quick_overrides"]

QUICK_SUPERNODES = 4
QUICK = {"num-server-rounds": 10, "local-steps": 40, "batch-size": 32, "eval-batch-size": 1000,
         "dynamicfl-local-steps": 40}


def quick_overrides(given: Mapping[str, object], num_supernodes: int
                    ) -> tuple[dict[str, object], str]:
    """``given`` on top of the quick preset for ``num_supernodes`` SuperNodes, and the note
    that says what the preset set."""
    preset = {**QUICK, "async-concurrency": num_supernodes,
              "fedbuff-buffer-size": max(num_supernodes // 2, 1),
              "fedasync-updates-per-round": max(num_supernodes // 2, 1)}
    applied = {key: value for key, value in preset.items() if key not in given}
    shown = " ".join(f"{key}={value}" for key, value in applied.items())
    note = (f"note: --quick: {num_supernodes} SuperNodes, {shown} (-c KEY=VALUE overrides any; "
            "without --quick the app's defaults are a study's: 10 SuperNodes, 2 local epochs)")
    return {**applied, **given}, note
