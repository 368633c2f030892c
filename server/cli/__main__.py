"""``python -m server.cli``: the same as the ``halfcast`` console script."""

import sys

from server.cli import main

if __name__ == "__main__":
    sys.exit(main())
