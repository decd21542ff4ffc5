"""FDNAS's and CFDNAS's end-of-run summary (``progress.summary_lines`` prints it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...progress import COST_COLUMNS, cost_cells, cost_table

__all__ = ["summary"]


def summary(document: Mapping[str, Any], settings: Any = None) -> list[str]:
    """Per net: the test accuracy of the trained net on its clients' pooled test data, and
    the mean of each client's test accuracy after its local epochs of the last round."""
    header = [
        "net",
        "model",
        *COST_COLUMNS,
        "params",
        "clients",
        "test acc (clients pooled)",
        "test acc after local epochs (client mean)",
    ]
    rows = [
        [
            n["name"],
            "-".join(n.get("options", [])),
            *cost_cells(n["flops"]),
            n.get("params"),
            len(n.get("partitions", [])),
            n.get("averaged_accuracy"),
            n.get("mean_local_accuracy"),
        ]
        for n in document.get("nets", [])
    ]
    return cost_table(header, rows, document.get("nets", []), "predicted_ms")
