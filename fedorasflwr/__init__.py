"""Federated neural architecture search (FedorAS, DecNAS, FDNAS, DP-FNAS) as a Flower app."""

import os

# Idle threads of torch's OpenMP pool sleep instead of spinning. A spinning pool costs
# little on a machine of its own, but a federated run shares its host: the ServerApp
# with the engine's clients, several SuperNodes, other jobs. There, two spinning threads
# and one core busy elsewhere made the server's path scoring 1.8x slower (load 2.3;
# ``python benchmarks/threads.py --rounds 3 --evaluations 2``).
# libgomp reads this once, when torch is first imported: it must be set before that (a
# process that imported torch earlier keeps its policy; an explicit setting wins).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__all__ = ["__version__", "load_model", "save_model"]

#: the package's version (semantic versioning; every public change is in CHANGELOG.md)
__version__ = "0.4.0"


def __getattr__(name: str) -> object:
    # ``import fedorasflwr`` stays light (no torch) until a model function is asked for
    if name in ("load_model", "save_model"):
        from . import model_files

        return getattr(model_files, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
