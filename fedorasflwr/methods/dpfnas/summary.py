"""DP-FNAS's end-of-run summary (``progress.summary_lines`` prints it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...costs import flops_to_macs
from ...progress import MFLOPS, MMACS, fmt, id_ranges, table
from ...results import cost_point
from ...search_spaces.darts import unsearched_lines

__all__ = ["points", "summary"]


def summary(document: Mapping[str, Any], settings: Any = None) -> list[str]:
    """The genotype, its test accuracy, the latency budget and the privacy spent per party
    (the delta of ``settings``, the run's ``DPFNASSettings``)."""
    delta = getattr(settings, "delta", None)
    space = document.get("space", {})
    low, high = space.get("min_flops", 0), space.get("max_flops", 0)
    lines = [
        f"genotype: {document.get('genotype', '-')}",
        *unsearched_lines(document.get("space", {})),
        f"iterations: {fmt(document.get('iterations'))}"
        + (
            f" ({document['stopped']})"
            if document.get("stopped", "completed") != "completed"
            else ""
        ),
        f"test accuracy of the derived net: {fmt(document.get('test_accuracy'))}",
        *(
            [
                f"global test acc of the derived net: {fmt(document['global_test_accuracy'])}"
                f" ({document.get('global_test_count')} samples on the server)"
            ]
            if document.get("global_test_accuracy") is not None
            else []
        ),
        f"supernet {MFLOPS}: {fmt(low / 1e6)}..{fmt(high / 1e6)}; "
        f"{MMACS}: {fmt(flops_to_macs(low) / 1e6)}..{fmt(flops_to_macs(high) / 1e6)}",
    ]
    budget = document.get("latency") or {}
    if "predicted_ms" in budget:
        lines.append(
            f"latency on the parties' table: {fmt(budget['predicted_ms'])} ms "
            f"(budget {fmt(budget.get('budget_ms'))} ms)"
        )
    header = ["parties", "epsilon", "eps weights", "eps arch", "steps"]
    # Parties that spent the same (most do: equal batches and steps) share one row.
    spent: dict[tuple[Any, ...], list[int]] = {}
    for p in document.get("privacy", []):
        key = (
            "inf" if p.get("epsilon") is None else fmt(p["epsilon"]),
            fmt(p["weights"].get("epsilon")),
            fmt(p["architecture"].get("epsilon")),
            fmt(p["weights"].get("steps")),
        )
        spent.setdefault(key, []).append(int(p["partition_id"]))
    rows = [[id_ranges(ids), *key] for key, ids in spent.items()]
    if rows:
        lines.append(f"privacy spent (delta {fmt(delta)}; - or inf: no guarantee):")
        lines += table(header, rows)
    return lines


def points(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The derived net as one cost point, with the privacy spent: the worst party's
    epsilon of the search (``"inf"`` where a party has no guarantee); the final FedAvg
    training is private only with ``dpfnas.final-noise`` > 0 (``final_privacy``)."""
    spent = [p.get("epsilon") for p in document.get("privacy", [])]
    epsilon: float | str | None = None
    if spent:  # "inf" (JSON has no infinity): a party without a guarantee
        epsilon = "inf" if any(e is None for e in spent) else max(spent)
    return [
        cost_point(
            "derived",
            flops=document.get("flops"),
            macs=document.get("macs"),
            test_accuracy=document.get("test_accuracy"),
            test_scope="last round's evaluated parties",
            global_test_accuracy=document.get("global_test_accuracy"),
            latency_ms=(document.get("latency") or {}).get("predicted_ms"),
            epsilon=epsilon,
        )
    ]
