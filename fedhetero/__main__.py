"""``python -m fedhetero COMMAND``: the ``fedhetero`` command (:mod:`fedhetero.cli`)."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
