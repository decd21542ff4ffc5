"""What travels between ServerApp and ClientApp: message types and record keys.

Defined once, imported by strategies and clients alike.  Keys are kebab-case;
message types are ``<category>.<action>`` with a Python-identifier action.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "ARRAYS",
    "CONFIG",
    "METRICS",
    "PROFILE",
    "LATENCY",
    "NONCE",
    "REPLY_BYTES",
    "DPFNAS_ARCH",
    "DECNAS_EVALUATE",
    "DECNAS_TRAIN",
    "DECNAS_TUNE",
    "DECNAS_UPLOAD",
    "DPFNAS_EVALUATE",
    "DPFNAS_TRAIN",
    "DPFNAS_WEIGHTS",
    "FEDORAS_EVALUATE",
    "FEDORAS_PATHS",
    "FEDORAS_SUPERNET",
    "FEDORAS_TRAIN",
    "FDNAS_EVALUATE",
    "FDNAS_SEARCH",
    "FDNAS_TRAIN",
    "QUERY_DECNAS_LATENCY",
    "QUERY_LATENCY",
    "QUERY_PROFILE",
    "SAMPLE_KINDS",
    "sample_kind",
    "space_from_config",
    "space_to_config",
]

ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"
PROFILE = "profile"
LATENCY = "latency"  # ConfigRecord of a query.latency reply: device, statistic
#: ConfigRecord of every instruction (``stage``, ``step``, ``tag``), echoed unchanged by its reply
NONCE = "nonce"
# in an instruction's config: the bytes of arrays the server asks back beyond what it sent
# (a DecNAS upload asks for a candidate's weights); read from the server's own copy
REPLY_BYTES = "reply-bytes"

QUERY_PROFILE = "query.profile"
QUERY_LATENCY = "query.latency"  # the node's latency table (fedorasflwr/latency.py)
QUERY_DECNAS_LATENCY = "query.decnas_latency"  # a prunable net's layer table (decnas/latency.py)
FEDORAS_SUPERNET = "train.fedoras_supernet"
FEDORAS_PATHS = "evaluate.fedoras_paths"
FEDORAS_TRAIN = "train.fedoras_finetune"
FEDORAS_EVALUATE = "evaluate.fedoras_finetune"
FDNAS_SEARCH = "train.fdnas_search"
FDNAS_TRAIN = "train.fdnas_final"
FDNAS_EVALUATE = "evaluate.fdnas_final"
DECNAS_TUNE = "train.decnas_tune"  # train and validate a candidate; keep the weights
DECNAS_UPLOAD = "train.decnas_upload"  # send the kept weights (survivors only)
DECNAS_TRAIN = "train.decnas_fedavg"  # FedAvg of GM_0, the tuned GMs, baselines
DECNAS_EVALUATE = "evaluate.decnas"
DPFNAS_WEIGHTS = "train.dpfnas_weights"
DPFNAS_ARCH = "train.dpfnas_arch"
DPFNAS_TRAIN = "train.dpfnas_final"
DPFNAS_EVALUATE = "evaluate.dpfnas_final"

SPACE_PREFIX = "space."

#: a profile's ``sample-dtype``: the kind of a sample's dtype (images: float, token ids: int)
SAMPLE_KINDS = ("float", "int", "bool", "complex")


def sample_kind(dtype: Any) -> str:
    """The kind (:data:`SAMPLE_KINDS`) of a ``torch.dtype``: what a profile's
    ``sample-dtype`` declares and a model's ``input_dtype`` must match."""
    if dtype.is_floating_point:
        return "float"
    if dtype.is_complex:
        return "complex"
    return "bool" if str(dtype) == "torch.bool" else "int"


def space_to_config(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A search space's ``spec`` as flat ``space.<kwarg>`` config entries."""
    return {SPACE_PREFIX + key: value for key, value in spec.items()}


def space_from_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Inverse of ``space_to_config``: the ``build_space`` keyword arguments."""
    return {k[len(SPACE_PREFIX) :]: v for k, v in config.items() if k.startswith(SPACE_PREFIX)}
