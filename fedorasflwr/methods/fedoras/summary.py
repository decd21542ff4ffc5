"""FedorAS's end-of-run summary (``progress.summary_lines`` prints it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...progress import COST_COLUMNS, cost_cells, cost_table, global_test_columns
from ...results import cost_point

__all__ = ["points", "summary"]


def summary(document: Mapping[str, Any], settings: Any = None) -> list[str]:
    """Per tier and init: the path's accuracy with the supernet's weights when the search
    chose it (validation data; only a supernet-init row has one: a rand-init row trains the
    same path from scratch) and the test accuracy after Stage 3."""
    header = [
        "tier",
        "init",
        "model",
        *COST_COLUMNS,
        "params",
        "supernet-path val acc (search)",
        "test acc after fine-tune",
    ]
    rows = []
    models = document.get("models", [])
    for m in models:
        test = m.get("test") or {}
        searched = m.get("init", "supernet") == "supernet"
        rows.append(
            [
                f"T{m['tier']}",
                m.get("init", "-"),
                "-".join(m.get("options", [])),
                *cost_cells(m["flops"]),
                m.get("params"),
                m.get("search_accuracy") if searched else None,
                test.get("accuracy"),
            ]
        )
    header = global_test_columns(header, rows, models)
    return cost_table(header, rows, models, "latency_ms")


def points(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each tier's fine-tuned model (and its rand-init twin, when run) as a cost point:
    the test accuracy pooled over the clients it was tested on (``test.clients``)."""
    rows = []
    for m in document.get("models", []):
        test = m.get("test") or {}
        rows.append(
            cost_point(
                f"T{m['tier']} {m.get('init', 'supernet')}",
                flops=m.get("flops"),
                macs=m.get("macs"),
                params=m.get("params"),
                test_accuracy=test.get("accuracy"),
                test_scope=f"{test.get('clients', '?')} clients, pooled",
                global_test_accuracy=m.get("global_test_accuracy"),
                latency_ms=m.get("latency_ms"),
            )
        )
    return rows
