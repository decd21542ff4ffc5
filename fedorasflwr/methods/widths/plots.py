"""The width baselines' plot (the shared style: ``fedorasflwr.plots``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...costs import macs_to_flops
from ...plots import FLOPS_LABEL, plot_points

__all__ = ["plot_tiers"]


def plot_tiers(path: Path, document: Mapping[str, Any], chance: float | None = None) -> Path | None:
    """Each tier's model: test accuracy (on its clients, on the global test set) against
    its MFLOPs per sample (MMACs on top), on [0, 1] with a line at ``chance``.
    ``document``: ``WidthResult.summary()`` with ``mode``."""
    tiers = document.get("tiers", ())

    def points(key: str) -> list[tuple[float, float]]:
        return [(macs_to_flops(t["macs"]) / 1e6, t[key]) for t in tiers if t.get(key) is not None]

    return plot_points(
        path,
        {
            "the tier's clients": points("test_accuracy"),
            "global test set": points("global_test_accuracy"),
        },
        title=f"{document.get('mode', '')}: each tier's model",
        xlabel=FLOPS_LABEL,
        ylabel="test accuracy",
        accuracy=True,
        chance=chance,
        cost=True,
    )
