"""The width baselines' plot (the shared style: ``fedorasflwr.plots``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...costs import macs_to_flops
from ...plots import FLOPS_LABEL, plot_points
from ...progress import fmt

__all__ = ["plot_tiers", "tier_name"]

#: how each method is written in a title
TITLES = {"heterofl": "HeteroFL", "fjord": "FjORD"}


def tier_name(tier: Mapping[str, Any]) -> str:
    """``"T1 w=0.25"``: a tier (1-based, as in ``result.json``) and its width (FjORD: p_max)."""
    return f"T{tier['tier']} w={fmt(tier['width'])}"


def plot_tiers(path: Path, document: Mapping[str, Any], chance: float | None = None) -> Path | None:
    """Each tier's model: test accuracy (on its clients, on the global test set) against
    its MFLOPs per sample (MMACs on top), on [0, 1] with a line at ``chance``, each point
    named with its tier and width (``tier_name``). ``document``: ``WidthResult.summary()``
    with ``mode``."""
    tiers = document.get("tiers", ())
    keys = ("test_accuracy", "global_test_accuracy")

    def cost(tier: Mapping[str, Any]) -> float:
        return macs_to_flops(tier["macs"]) / 1e6

    def points(key: str) -> list[tuple[float, float]]:
        return [(cost(t), t[key]) for t in tiers if t.get(key) is not None]

    names = [
        (cost(t), max(t[k] for k in keys if t.get(k) is not None), tier_name(t))
        for t in tiers
        if any(t.get(k) is not None for k in keys)
    ]
    mode = document.get("mode", "")
    return plot_points(
        path,
        {
            "the tier's clients": points("test_accuracy"),
            "global test set": points("global_test_accuracy"),
        },
        title=f"{TITLES.get(mode, mode)}: each tier's model (T: tier, w: its width)",
        xlabel=FLOPS_LABEL,
        ylabel="test accuracy",
        accuracy=True,
        chance=chance,
        cost=True,
        names=names,
    )
