"""FDNAS's and CFDNAS's end-of-run summary (``progress.summary_lines`` prints it)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ...progress import COST_COLUMNS, cost_cells, cost_table, global_test_columns
from ...results import cost_point

__all__ = ["points", "pooled_accuracy", "summary"]


def pooled_accuracy(net: Mapping[str, Any], partitions: Iterable[Any]) -> float | None:
    """``net``'s test accuracy on the pooled test data of ``partitions`` (its per-client
    ``test_accuracy`` weighted by ``test_count``, keys as result.json writes them);
    None when it has no test sample there."""
    accuracy, count = net.get("test_accuracy", {}), net.get("test_count", {})
    keys = [str(p) for p in partitions if str(p) in accuracy and count.get(str(p))]
    total = sum(count[k] for k in keys)
    return sum(accuracy[k] * count[k] for k in keys) / total if total else None


def summary(document: Mapping[str, Any], settings: Any = None) -> list[str]:
    """Per net: the test accuracy of the trained net on its clients' pooled test data, and
    the mean of each client's test accuracy after its local epochs of the last round (with
    ``data.global-test``: its accuracy on the server's global test set too). CFDNAS adds,
    per cluster net, the global (FDNAS) net on the same clients: the comparison the
    clusters are for."""
    nets = document.get("nets", [])
    global_net = next((n for n in nets if n["name"] == "fdnas"), None)
    compare = global_net is not None and len(nets) > 1
    header = [
        "net",
        "model",
        *COST_COLUMNS,
        "params",
        "clients",
        "test acc (clients pooled)",
        "test acc after local epochs (client mean)",
        *(["fdnas net on these clients"] if compare else []),
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
            *(
                [
                    pooled_accuracy(global_net, n.get("partitions", []))
                    if n is not global_net
                    else "-"
                ]
                if compare
                else []
            ),
        ]
        for n in nets
    ]
    header = global_test_columns(header, rows, nets)
    return cost_table(header, rows, nets, "predicted_ms")


def points(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each derived net (FDNAS's; CFDNAS's per cluster too) as a cost point: its test
    accuracy pooled over its own clients' test splits (``averaged_accuracy``)."""
    return [
        cost_point(
            str(n["name"]),
            flops=n.get("flops"),
            macs=n.get("macs"),
            params=n.get("params"),
            test_accuracy=n.get("averaged_accuracy"),
            test_scope=f"its {len(n.get('partitions', []))} clients, pooled",
            global_test_accuracy=n.get("global_test_accuracy"),
            latency_ms=n.get("predicted_ms"),
        )
        for n in document.get("nets", [])
    ]
