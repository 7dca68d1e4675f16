"""``python -m fedhetero COMMAND``: the same as the ``fedhetero`` console script."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
