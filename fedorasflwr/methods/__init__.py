"""One package per method: its strategy and stages (server) and ``client.py`` (client).

- ``fedoras``: FedorAS (Dudziak et al., 2022): supernet, tiered search, fine-tuning;
- ``decnas``: DecNAS: NetAdapt-style pruning, grouped candidates;
- ``fednas``: FedNAS (He et al., 2020): FedAvg of local DARTS searches (baseline).
- ``fdnas``: FDNAS and CFDNAS (He et al., 2020): DARTS-style search over MBConv;
- ``dpfnas``: DP-FNAS (Singh et al., 2020): differentially private DARTS;
- ``widths``: the width-scaling baselines ``heterofl`` (Diao et al., 2021) and ``fjord``
  (Horvath et al., 2021) on one fixed ConvNet.

Rules (``tests/test_layout.py``): a method imports no other method; a server module
(anything but ``client.py``) imports no client module.  Shared server code lives in
``fedorasflwr.federation``, the torch loops both sides use in ``fedorasflwr.training``.
Each package's ``__init__`` imports nothing, so a ClientApp loads only ``client.py`` and
what it imports; this one names every method's settings class by its import path
(``settings_class`` imports it when asked).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

#: every method a run config's ``method`` may name (``cfdnas`` is FDNAS's clustered variant)
METHODS = ("fedoras", "fdnas", "cfdnas", "dpfnas", "decnas", "fednas", "heterofl", "fjord")

#: method -> the import path of its settings class (``methods/<method>/settings.py``),
#: imported when asked for: importing this package loads no method
SETTINGS = {
    "fedoras": "fedorasflwr.methods.fedoras.settings:FedorASSettings",
    "fdnas": "fedorasflwr.methods.fdnas.settings:FDNASSettings",
    "cfdnas": "fedorasflwr.methods.fdnas.settings:FDNASSettings",
    "dpfnas": "fedorasflwr.methods.dpfnas.settings:DPFNASSettings",
    "decnas": "fedorasflwr.methods.decnas.settings:DecNASSettings",
    "fednas": "fedorasflwr.methods.fednas.settings:FedNASSettings",
    "heterofl": "fedorasflwr.methods.widths.settings:HeteroFLSettings",
    "fjord": "fedorasflwr.methods.widths.settings:FjORDSettings",
}


#: method -> the import path of its end-of-run summary (``methods/<method>/summary.py``)
SUMMARIES = {
    "fedoras": "fedorasflwr.methods.fedoras.summary:summary",
    "fdnas": "fedorasflwr.methods.fdnas.summary:summary",
    "cfdnas": "fedorasflwr.methods.fdnas.summary:summary",
    "dpfnas": "fedorasflwr.methods.dpfnas.summary:summary",
    "decnas": "fedorasflwr.methods.decnas.summary:summary",
    "fednas": "fedorasflwr.methods.fednas.summary:summary",
    "heterofl": "fedorasflwr.methods.widths.summary:summary",
    "fjord": "fedorasflwr.methods.widths.summary:summary",
}


#: method -> the import path of its cost points (``points(document)`` in its summary.py):
#: each final model of a result.json as one row of ``python -m fedorasflwr.compare``'s
#: leaderboard (``model``, ``macs``, ``flops``, ``params``, ``test_accuracy`` with its
#: ``test_scope``, ``global_test_accuracy``, ``latency_ms``, ``epsilon``)
POINTS = {method: path.replace(":summary", ":points") for method, path in SUMMARIES.items()}

#: method -> its run-config keys that count training rounds (each stage's; ints), which
#: ``python -m fedorasflwr.compare`` scales to match client training FLOPs
ROUND_KEYS = {
    "fedoras": ("fedoras.rounds", "fedoras.finetune-rounds"),
    "fdnas": ("fdnas.rounds", "fdnas.final-rounds"),
    "cfdnas": ("fdnas.rounds", "fdnas.cluster-rounds", "fdnas.final-rounds"),
    "dpfnas": ("dpfnas.iterations", "dpfnas.final-rounds"),
    "decnas": ("decnas.gm0-rounds", "decnas.final-rounds"),
    "fednas": ("fednas.rounds", "fednas.final-rounds"),
    "heterofl": ("heterofl.rounds",),
    "fjord": ("fjord.rounds",),
}


def _load(table: dict[str, str], method: str) -> Any:
    if method not in table:
        raise ValueError(f"method {method!r}: allowed: one of {', '.join(METHODS)}")
    module, _, name = table[method].partition(":")
    return getattr(importlib.import_module(module), name)


def settings_class(method: str) -> type:
    """The settings class of ``method`` (one of ``METHODS``)."""
    return _load(SETTINGS, method)


def summary_function(method: str) -> Callable[..., list[str]]:
    """``summary(document, **options)`` of ``method``: its end-of-run summary lines."""
    return _load(SUMMARIES, method)


def points_function(method: str) -> Callable[..., list[dict[str, Any]]]:
    """``points(document)`` of ``method``: each final model of its result.json, one dict
    per cost point (``POINTS``)."""
    return _load(POINTS, method)
