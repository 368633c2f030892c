"""``python -m halfcast.cli``: the same as the ``halfcast`` console script."""

import sys

from halfcast.cli import main

if __name__ == "__main__":
    sys.exit(main())
