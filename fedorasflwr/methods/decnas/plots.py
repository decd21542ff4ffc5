"""DecNAS's plots (the shared style: ``fedorasflwr.plots``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...costs import macs_to_flops
from ...plots import accuracy_axis, colour, figure, finish, flops_axis, label


def _mflops(macs: float) -> float:
    """The x value of a model of ``macs`` MACs: MFLOPs (the rule of every cost axis)."""
    return macs_to_flops(macs) / 1e6


def plot_frontier(
    path: Path,
    document: Mapping[str, Any],
    variant: str = "",
    chance: float | None = None,
    rounds: Mapping[int, int] | None = None,
) -> Path | None:
    """DecNAS (``variant``): test accuracy against cost of GM_0..GM_T (each labelled), after
    FL tuning, and the width-multiplier baseline: MFLOPs below, MMACs (the resource DecNAS
    prunes by) on top (``flops_axis``).  ``document``: ``DecNASResult.summary()``.
    ``rounds`` (iteration -> FedAvg rounds GM_t was trained, all told:
    ``DecNASSettings.rounds_trained``) goes into each GM_t's label: GM_t starts from
    GM_t-1's weights, so a later, cheaper GM has trained longer, and a frontier of
    short-term accuracies need not fall with the cost (quick-decnas: GM_1 at 6 rounds below
    GM_2 at 7 and GM_3 at 9)."""
    rounds = rounds or {}
    frontier = document.get("frontier", ())
    series = [
        ("GM$_t$", "test-accuracy", "-", "o", True),
        ("GM$_t$, FL-tuned", "tuned-test-accuracy", "--", "s", False),
    ]
    drawn: list[float] = []
    fig, ax = figure()
    for index, (name, key, style, marker, filled) in enumerate(series):
        points = sorted(
            (_mflops(m["macs"]), m[key], m["iteration"]) for m in frontier if m.get(key) is not None
        )
        if not points:
            continue
        c = colour(index)
        ax.plot(
            [p[0] for p in points],
            [p[1] for p in points],
            style,
            marker=marker,
            color=c,
            markerfacecolor=c if filled else "white",
            label=name,
        )
        for x, y, t in points:
            trained = f", {rounds[t]} rds" if filled and t in rounds else ""
            label(ax, x, y, f"GM$_{{{t}}}${trained}", c, "below" if filled else "left")
        drawn += [p[1] for p in points]
    baseline = sorted(
        (_mflops(r["macs"]), r["test-accuracy"])
        for r in document.get("width-baseline", ())
        if r.get("test-accuracy") is not None
    )
    if baseline:
        ax.plot(
            *zip(*baseline, strict=True), ":", marker="^", color=colour(2), label="width multiplier"
        )
        drawn += [p[1] for p in baseline]
    if not drawn:
        return None
    accuracy_axis(ax, chance)
    ax.set_xmargin(0.12)
    return finish(
        fig,
        ax,
        path,
        title=f"DecNAS{f' ({variant})' if variant else ''}: test accuracy against cost"
        + (
            "\n(rds: FedAvg rounds GM$_t$ trained, GM$_0$'s and every iteration's)"
            if rounds
            else ""
        ),
        xlabel=flops_axis(ax),
        ylabel="test accuracy",
    )
