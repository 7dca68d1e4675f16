"""``python -m deploy.supernode ARGS``: ``flower-supernode ARGS`` with Flower's fixed waits
shortened (:func:`flower_patches.shorten_supernode_waits`, asked for in :func:`main`): an
idle SuperNode pulls every 0.5 s instead of 3 s (``FEDHETERO_SUPERNODE_IDLE_PULL`` seconds
to change it; each idle SuperNode sends 1/that requests a second to the SuperLink), it
checks for its ClientApp's reply every 0.05 s, and a message's arrays that are not there
yet are asked for again after 0.05 s. Every argument goes to Flower's ``flower-supernode``
unchanged.
"""

from __future__ import annotations

import os
import sys

from flwr.supernode.cli import flower_supernode

from fedapp.flower_patches import SUPERNODE_IDLE_PULL, shorten_supernode_waits

IDLE_PULL_ENV = "FEDHETERO_SUPERNODE_IDLE_PULL"


def idle_pull_seconds(environ: dict[str, str] | os._Environ = os.environ) -> float:
    """``FEDHETERO_SUPERNODE_IDLE_PULL`` as seconds (default 0.5); a clear error if bad."""
    raw = environ.get(IDLE_PULL_ENV)
    if raw is None:
        return SUPERNODE_IDLE_PULL
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 60:
        raise SystemExit(f"{IDLE_PULL_ENV}={raw!r}: give seconds in (0, 60], e.g. "
                         f"{IDLE_PULL_ENV}=0.5 (Flower's own SuperNode waits 3)")
    return value


def main() -> None:
    shorten_supernode_waits(idle=idle_pull_seconds())
    sys.argv[0] = "flower-supernode"  # what Flower's logs and telemetry look at
    flower_supernode()


if __name__ == "__main__":
    main()
