"""``python -m fedorasflwr.launch``: see `fedorasflwr.launch.cli`."""

import atexit
import os
import sys

from .cli import main

if __name__ == "__main__":
    code = main()
    if code >= 128:  # a signal stopped the run: every Flower process is gone, files closed
        # leave at once: tearing down torch's and Flower's modules takes 2-3 s more on a
        # loaded machine (benchmarks/signal_stop.py), and whoever sent the signal waits
        sys.stdout.flush()
        sys.stderr.flush()
        atexit._run_exitfuncs()
        os._exit(code)
    sys.exit(code)
