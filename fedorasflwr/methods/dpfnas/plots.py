"""DP-FNAS's plots (the shared style: ``fedorasflwr.plots``)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...plots import accuracy_axis, colour, figure, finish, integer_ticks, label


def plot_dpfnas(
    path: Path,
    history: Sequence[Mapping[str, Any]],
    target_epsilon: float = 0.0,
    chance: float | None = None,
    derived_accuracy: float | None = None,
) -> Path | None:
    """DP-FNAS: the worst party's epsilon (top) and the mixed supernet's validation
    accuracy (bottom) per iteration; ``target_epsilon`` > 0 draws the stopping target;
    ``derived_accuracy`` (the derived net's test accuracy after its final training) is a
    star at the last iteration, so a search near chance is not read as the result."""
    # epsilon is inf without noise (modes fnas / single, or sigma = 0): nothing to draw
    spent = [(h["iteration"], h["epsilon"]) for h in history if h.get("epsilon") is not None]
    epsilon = [(i, e) for i, e in spent if math.isfinite(e)]
    accuracy = [
        (h["iteration"], h["val-accuracy"]) for h in history if h.get("val-accuracy") is not None
    ]
    if not spent and not accuracy:
        return None
    fig, (top, bottom) = figure(6.5, 5.0, rows=2)
    if epsilon:
        top.plot(*zip(*epsilon, strict=True), marker="o", color=colour(5), label="epsilon")
        label(top, *epsilon[-1], f"{epsilon[-1][1]:.3g}", colour(5), "left")
    elif spent:
        top.text(
            0.5,
            0.5,
            "no noise: no privacy (epsilon = inf)",
            ha="center",
            transform=top.transAxes,
            color="0.4",
        )
    if target_epsilon > 0:
        top.axhline(target_epsilon, color="0.4", linestyle=":", label="target")
        top.legend(fontsize=9, loc="lower right")
    top.set_ylabel("epsilon (worst party)")
    top.set_ylim(0, 1.2 * max([e for _, e in epsilon] + [target_epsilon, 1e-9]))
    handles = []
    if accuracy:
        handles += bottom.plot(
            *zip(*accuracy, strict=True),
            marker="o",
            color=colour(0),
            label="mixed supernet, server validation",
        )
    else:
        bottom.text(
            0.5,
            0.5,
            "no server validation in this run",
            ha="center",
            transform=bottom.transAxes,
            color="0.4",
        )
    if derived_accuracy is not None and (accuracy or spent):
        last = max(i for i, _ in accuracy + spent)
        (star,) = bottom.plot(
            [last],
            [derived_accuracy],
            marker="*",
            markersize=12,
            linestyle="",
            color=colour(3),
            label="derived net, test (after final training)",
        )
        label(bottom, last, derived_accuracy, f"{derived_accuracy:.2f}", colour(3), "left")
        handles.append(star)
    if accuracy or handles:
        line = accuracy_axis(bottom, chance)
        handles += [line] if line is not None else []
        if handles:
            bottom.legend(handles=handles, fontsize=9, loc="upper left")
    integer_ticks(bottom)
    return finish(
        fig,
        bottom,
        path,
        title="DP-FNAS: privacy spent and supernet accuracy",
        xlabel="iteration",
        ylabel="accuracy",
        legend=False,
    )
