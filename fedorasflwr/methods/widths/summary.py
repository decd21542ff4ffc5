"""The width baselines' end-of-run summary (``progress.summary_lines`` prints it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...costs import macs_to_flops
from ...progress import COST_COLUMNS, cost_cells, fmt, id_ranges, table
from ...results import cost_point

__all__ = ["points", "summary"]


def summary(document: Mapping[str, Any], settings: Any = None) -> list[str]:
    """One row per tier: its width, cost (MFLOPs and MMACs), parameters, partitions and
    test accuracies."""
    header = ["tier", "width", *COST_COLUMNS, "params", "partitions", "test acc"]
    header.append("global test acc")
    rows = [
        [
            str(t["tier"]),
            fmt(t["width"]),
            *(fmt(c) for c in cost_cells(t.get("flops") or macs_to_flops(t["macs"]))),
            str(t["params"]),
            id_ranges(t.get("partitions", [])),
            fmt(t.get("test_accuracy")),
            fmt(t.get("global_test_accuracy")),
        ]
        for t in document.get("tiers", [])
    ]
    return [f"{document.get('mode', '-')}: each tier's model", *table(header, rows)]


def points(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each tier's model (the ConvNet at its width) as a cost point: its test accuracy on
    its own tier's clients."""
    return [
        cost_point(
            f"T{t['tier']} w={fmt(t['width'])}",
            flops=t.get("flops"),
            macs=t.get("macs"),
            params=t.get("params"),
            test_accuracy=t.get("test_accuracy"),
            test_scope=f"tier {t['tier']}'s {len(t.get('partitions', []))} clients, pooled",
            global_test_accuracy=t.get("global_test_accuracy"),
        )
        for t in document.get("tiers", [])
    ]
