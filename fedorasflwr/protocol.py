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
    "PACKING",
    "REPLY_BYTES",
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
#: ConfigRecord beside a packed ``arrays`` record: its version and index (fedorasflwr/packing.py)
PACKING = "packing"
# in an instruction's config: the bytes of arrays the server asks back beyond what it sent
# (a DecNAS upload asks for a candidate's weights); read from the server's own copy
REPLY_BYTES = "reply-bytes"

QUERY_PROFILE = "query.profile"
QUERY_LATENCY = "query.latency"  # the node's latency table (fedorasflwr/latency.py)

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
