"""FDNAS's and CFDNAS's end-of-run summary (``progress.summary_lines`` prints it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...progress import MFLOPS, cost_table, global_test_columns

__all__ = ["summary"]


def summary(document: Mapping[str, Any], settings: Any = None) -> list[str]:
    """Per net: the test accuracy of the trained net on its clients' pooled test data, and
    the mean of each client's test accuracy after its local epochs of the last round (with
    ``data.global-test``: its accuracy on the server's global test set too)."""
    header = [
        "net",
        "model",
        MFLOPS,
        "params",
        "clients",
        "test acc (clients pooled)",
        "test acc after local epochs (client mean)",
    ]
    rows = [
        [
            n["name"],
            "-".join(n.get("options", [])),
            n["flops"] / 1e6,
            n.get("params"),
            len(n.get("partitions", [])),
            n.get("averaged_accuracy"),
            n.get("mean_local_accuracy"),
        ]
        for n in document.get("nets", [])
    ]
    header = global_test_columns(header, rows, document.get("nets", []))
    return cost_table(header, rows, document.get("nets", []), "predicted_ms")
