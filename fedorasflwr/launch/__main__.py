"""``python -m fedorasflwr.launch``: see `fedorasflwr.launch.cli`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
