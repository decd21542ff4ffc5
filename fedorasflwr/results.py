"""``result.json``'s form, one definition for every method.

A runner returns its result document with the keys its strategy writes; the ServerApp's
``Checkpointer`` writes it through ``result_json``, which gives every run's ``result.json``

- every key in snake_case, at every depth (``run_id``, ``tier_of_partition``,
  ``models[].search_accuracy``, ``history[].val_accuracy``, ``space.max_flops``), as the
  ``settings`` and ``status`` entries are; keys that are data keep their spelling: the
  ledger's stage names (``finetune-t1-supernet``, as the logs name the stage), partition and
  node ids, file names (a key with a ``.``, as in ``onnx``) and the stage names keying
  ``latency_tables.groups``;
- the ``ledger`` by partition id (``ledger.by_partition``: per stage ``partitions`` with
  each partition's Flower ``node_ids``, and ``unprofiled`` nodes by node id).

A runner's document in memory (what the plots and the summary read) keeps the kebab-case
names of the records it was built from; only the file is converted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .costs import flops_to_macs, macs_to_flops
from .ledger import by_partition

__all__ = ["POINT_FIELDS", "cost_point", "result_json", "snake", "snake_keys"]

#: what each method's ``points(document)`` gives per final model (``cost_point``): one row of
#: ``python -m fedorasflwr.compare``'s leaderboard
POINT_FIELDS = (
    "model",  # the model's name within its run ("T2 supernet", "GM_3 tuned", "cluster-1")
    "macs",  # MACs of one sample (the papers' "FLOPs"); None: not known
    "flops",  # FLOPs of one sample (2 x MACs, torch.utils.flop_counter)
    "params",  # parameters
    "test_accuracy",  # on the clients' test splits (test_scope says which)
    "test_scope",  # which clients' test splits test_accuracy pools
    "global_test_accuracy",  # on the server's global test set (data.global-test); else None
    "latency_ms",  # on the nodes' measured latency tables (a latency resource); else None
    "epsilon",  # DP budget spent (the worst party's; "inf": no guarantee); None: no accounting
)


def snake(key: str) -> str:
    """``"tier-of-partition"`` -> ``"tier_of_partition"``."""
    return key.replace("-", "_")


#: keys whose mapping is keyed by stage names (data, as the logs name the stages):
#: ``latency_tables.groups`` (FDNAS / CFDNAS: ``search``, ``cluster-0``, ...)
STAGE_KEYED = frozenset({"groups"})


def snake_keys(value: Any, stage_keyed: bool = False) -> Any:
    """``value`` with every mapping key in snake_case (``snake``), at every depth; a key
    that is data keeps its spelling: one with a ``.`` (a file name), none of the letters
    (an id), or a stage name (``stage_keyed``: the mapping under a ``STAGE_KEYED`` key)."""
    if isinstance(value, Mapping):
        converted: dict[str, Any] = {}
        for key, item in value.items():
            name = str(key)
            if not stage_keyed and "." not in name and any(c.isalpha() for c in name):
                name = snake(name)
            if name in converted:
                raise ValueError(f"result document: keys {key!r} and {name!r} are the same key")
            converted[name] = snake_keys(item, name in STAGE_KEYED)
        return converted
    if isinstance(value, list | tuple):
        return [snake_keys(item) for item in value]
    return value


def result_json(document: Mapping[str, Any]) -> dict[str, Any]:
    """``document`` as ``result.json`` holds it: every key in snake_case (``snake_keys``;
    the ledger's stage names as they are), the ledger (a ``Ledger.summary()``) by partition
    id. Two keys that differ only in ``-`` / ``_`` are refused (``ValueError``)."""
    content: dict[str, Any] = {}
    for key, value in document.items():
        name = snake(str(key))
        if name in content:
            raise ValueError(f"result document: keys {key!r} and {name!r} are the same key")
        if name == "ledger" and value:
            ledger = by_partition(value)
            content[name] = {stage: snake_keys(entry) for stage, entry in ledger.items()}
        else:
            content[name] = snake_keys(value)
    return content


def cost_point(model: str, **fields: Any) -> dict[str, Any]:
    """One final model of a run as a leaderboard row: ``POINT_FIELDS`` (an unknown field is
    refused), absent ones ``None``; ``flops`` from ``macs`` or ``macs`` from ``flops``
    when only one is given (``costs``)."""
    unknown = set(fields) - set(POINT_FIELDS)
    if unknown:
        raise ValueError(f"cost point {model!r}: unknown fields {sorted(unknown)}")
    point: dict[str, Any] = {name: fields.get(name) for name in POINT_FIELDS}
    point["model"] = model
    if point["flops"] is None and point["macs"] is not None:
        point["flops"] = macs_to_flops(point["macs"])
    if point["macs"] is None and point["flops"] is not None:
        point["macs"] = flops_to_macs(point["flops"])
    return point
