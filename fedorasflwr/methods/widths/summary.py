"""The width baselines' end-of-run summary (``progress.summary_lines`` prints it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...progress import MMACS, fmt, id_ranges, table

__all__ = ["summary"]


def summary(document: Mapping[str, Any], settings: Any = None) -> list[str]:
    """One row per tier: its width, MACs, parameters, partitions and test accuracies."""
    header = ["tier", "width", MMACS, "params", "partitions", "test acc", "global test acc"]
    rows = [
        [
            str(t["tier"]),
            fmt(t["width"]),
            fmt(t["macs"] / 1e6),
            str(t["params"]),
            id_ranges(t.get("partitions", [])),
            fmt(t.get("test_accuracy")),
            fmt(t.get("global_test_accuracy")),
        ]
        for t in document.get("tiers", [])
    ]
    return [f"{document.get('mode', '-')}: each tier's model", *table(header, rows)]
