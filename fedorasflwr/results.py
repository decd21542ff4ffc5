"""``result.json``'s form, one definition for every method.

A runner returns its result document with the keys its strategy writes; the ServerApp's
``Checkpointer`` writes it through ``result_json``, which gives every run's ``result.json``

- top-level keys in snake_case (``run_id``, ``resumed_from``, ``tier_of_partition``, ...),
  as the ``status`` entries are; the ``settings`` section is written as it is given;
- the ``ledger`` by partition id (``ledger.by_partition``: per stage ``partitions`` with
  each partition's Flower ``node_ids``, and ``unprofiled`` nodes by node id).

Entries below the top level keep their own style (e.g. ``models[].search-accuracy``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .ledger import by_partition

__all__ = ["result_json", "snake"]


def snake(key: str) -> str:
    """``"tier-of-partition"`` -> ``"tier_of_partition"``."""
    return key.replace("-", "_")


def result_json(document: Mapping[str, Any]) -> dict[str, Any]:
    """``document`` as ``result.json`` holds it: top-level keys in snake_case, the ledger
    (a ``Ledger.summary()``) by partition id. Two keys that differ only in ``-`` / ``_``
    are refused (``ValueError``)."""
    content: dict[str, Any] = {}
    for key, value in document.items():
        name = snake(str(key))
        if name in content:
            raise ValueError(f"result document: keys {key!r} and {name!r} are the same key")
        content[name] = by_partition(value) if name == "ledger" and value else value
    return content
