"""DecNAS's end-of-run summary (``progress.summary_lines`` prints it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...costs import macs_to_flops
from ...progress import COST_COLUMNS, cost_cells, cost_table, global_test_columns
from ...results import cost_point

__all__ = ["points", "summary"]


def summary(document: Mapping[str, Any], settings: Any = None) -> list[str]:
    """Per GM_t: its validation accuracy when the search chose it, its test accuracy then,
    and after the long-term FedAvg tuning (with ``data.global-test``: both on the server's
    global test set too)."""
    header = [
        "GM",
        "widths",
        *COST_COLUMNS,
        "params",
        "val acc (search)",
        "test acc",
        "test acc after tuning",
    ]
    rows = [
        [
            f"GM_{m['iteration']}",
            "x".join(str(w) for w in m.get("widths", [])),
            *cost_cells(macs_to_flops(m["macs"])),
            m.get("params"),
            m.get("search_val_accuracy"),
            m.get("test_accuracy"),
            m.get("tuned_test_accuracy"),
        ]
        for m in document.get("frontier", [])
    ]
    columns = {
        "global test acc": "global_test_accuracy",
        "global test acc after tuning": "tuned_global_test_accuracy",
    }
    header = global_test_columns(header, rows, document.get("frontier", []), columns)
    return cost_table(header, rows, document.get("frontier", []), "latency_ms")


def points(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each GM_t of the frontier as a cost point (its accuracy when the search chose it),
    and each tuned GM once more after its long-term FedAvg tuning."""
    rows = []
    for m in document.get("frontier", []):
        common = {"macs": m.get("macs"), "params": m.get("params")}
        common["latency_ms"] = m.get("latency_ms")
        rows.append(
            cost_point(
                f"GM_{m['iteration']}",
                **common,
                test_accuracy=m.get("test_accuracy"),
                test_scope="all clients, pooled",
                global_test_accuracy=m.get("global_test_accuracy"),
            )
        )
        if m.get("tuned_test_accuracy") is not None:
            rows.append(
                cost_point(
                    f"GM_{m['iteration']} tuned",
                    **common,
                    test_accuracy=m.get("tuned_test_accuracy"),
                    test_scope="all clients, pooled",
                    global_test_accuracy=m.get("tuned_global_test_accuracy"),
                )
            )
    return rows
