"""The width baselines' end-of-run summary (``progress.summary_lines`` prints it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...costs import macs_to_flops
from ...progress import COST_COLUMNS, cost_cells, fmt, id_ranges, table
from ...results import cost_point

__all__ = ["points", "summary", "update_shares"]


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
    lines = [f"{document.get('mode', '-')}: each tier's model", *table(header, rows)]
    ladder = getattr(settings, "ladder", None)
    tiers = document.get("tiers", [])
    if document.get("mode") == "fjord" and ladder and tiers:
        shares = update_shares(ladder, [(t["width"], len(t.get("partitions", []))) for t in tiers])
        lines.append(
            "share of client-batches training each width's outer channels: "
            + ", ".join(
                f"{fmt(w)} {fmt(share, 2)}" for w, share in zip(ladder, shares, strict=True)
            )
            + " (ordered dropout: a tier samples widths up to its p_max)"
        )
    return lines


def update_shares(ladder: Sequence[float], tiers: Sequence[tuple[float, int]]) -> list[float]:
    """Under FjORD's ordered dropout, the share of all client-batches that update the outer
    channels of each ``ladder`` width (those beyond the width below it): ``tiers`` are
    ``(p_max, clients)``, each client sampling a width uniformly from the ladder up to its
    p_max per batch. The smallest width's channels are in every batch (1.0); quick-fjord's
    (4 tiers of 5 clients): 1, 0.48, 0.21, 0.0625, so the wide slices train far less."""
    total = sum(clients for _, clients in tiers)
    shares = []
    for width in ladder:
        share = 0.0
        for p_max, clients in tiers:
            reach = [w for w in ladder if w <= p_max + 1e-9]
            share += clients * sum(1 for w in reach if w >= width - 1e-9) / len(reach)
        shares.append(share / total if total else 0.0)
    return shares


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
