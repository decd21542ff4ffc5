"""FedorAS's plots (the shared style: ``fedorasflwr.plots``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...plots import (
    accuracy_axis,
    colour,
    dodge,
    figure,
    finish,
    flops_axis,
    integer_ticks,
    label,
    legend_outside,
)

#: FedorAS model ``init`` -> (legend name, line style, marker, filled)
INITS = {"supernet": ("supernet init", "-", "o", True), "random": ("random init", "--", "s", False)}


def _init_style(init: str) -> tuple[str, str, str, bool]:
    return INITS.get(init, (f"{init} init", ":", "^", False))


def _init_handle(init: str) -> Any:
    """The legend entry of a FedorAS initialisation: its line style and marker, in grey."""
    from matplotlib.lines import Line2D

    name, style, marker, filled = _init_style(init)
    return Line2D(
        [],
        [],
        linestyle=style,
        marker=marker,
        color="0.3",
        markerfacecolor="0.3" if filled else "white",
        label=name,
    )


def plot_tiers(
    path: Path, models: Sequence[Mapping[str, Any]], chance: float | None = None
) -> Path | None:
    """FedorAS: test accuracy against MFLOPs (MMACs on top: ``flops_axis``), one point per
    tier model labelled T1..Tn, filled for supernet init, hollow for random init.
    ``models``: the result's ``models`` (``tier`` 1-based, ``init``, ``flops``,
    ``test.accuracy``)."""
    tested = [m for m in models if m.get("test")]
    if not tested:
        return None
    fig, ax = figure()
    handles: list[Any] = []
    for init in dict.fromkeys(m["init"] for m in tested):
        name, style, marker, filled = _init_style(init)
        points = sorted(
            (m["flops"] / 1e6, m["test"]["accuracy"], m["tier"])
            for m in tested
            if m["init"] == init
        )
        ax.plot(
            [p[0] for p in points],
            [p[1] for p in points],
            style,
            color="0.6",
            zorder=1,
        )
        handles.append(_init_handle(init))
        for x, y, tier in points:
            c = colour(tier - 1)
            ax.scatter(
                x,
                y,
                marker=marker,
                s=60,
                zorder=2,
                edgecolors=c,
                linewidths=1.5,
                facecolors=c if filled else "white",
            )
            label(ax, x, y, f"T{tier}", c)
    line = accuracy_axis(ax, chance)
    legend_outside(ax, handles + ([line] if line is not None else []))
    ax.set_xmargin(0.12)
    return finish(
        fig,
        ax,
        path,
        title="FedorAS: test accuracy per tier",
        xlabel=flops_axis(ax),
        ylabel="test accuracy",
        legend=False,
    )


def plot_finetune(
    path: Path, models: Sequence[Mapping[str, Any]], chance: float | None = None
) -> Path | None:
    """FedorAS Stage 3: server validation accuracy per fine-tuning round, one colour per
    tier, solid for supernet init and dashed for random init; curves are shifted a
    little apart on the round axis (``dodge``) so that equal ones stay visible."""
    curves = [
        (m, [(h["round"], h["val-accuracy"]) for h in m.get("history", ()) if "val-accuracy" in h])
        for m in models
    ]
    curves = [(m, points) for m, points in curves if points]
    if not curves:
        return None
    from matplotlib.lines import Line2D

    fig, ax = figure(7.0, 4.0)
    for index, (m, points) in enumerate(curves):
        _name, style, marker, filled = _init_style(m["init"])
        c = colour(m["tier"] - 1)
        shift = dodge(index, len(curves))
        ax.plot(
            [x + shift for x, _ in points],
            [y for _, y in points],
            style,
            marker=marker,
            color=c,
            alpha=0.85,
            markersize=7 if filled else 8,
            markerfacecolor=c if filled else "none",
            linewidth=2 if filled else 1.5,
        )
    tiers = sorted({m["tier"] for m, _ in curves})
    inits = list(dict.fromkeys(m["init"] for m, _ in curves))
    handles = [Line2D([], [], color=colour(t - 1), linewidth=3, label=f"T{t}") for t in tiers]
    handles += [_init_handle(init) for init in inits]
    line = accuracy_axis(ax, chance)
    legend_outside(ax, handles + ([line] if line is not None else []))
    integer_ticks(ax)
    return finish(
        fig,
        ax,
        path,
        title="FedorAS Stage 3: fine-tuning (server validation)",
        xlabel="fine-tuning round",
        ylabel="validation accuracy",
        legend=False,
    )
