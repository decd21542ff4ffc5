"""The plots a run writes beside ``result.json``, drawn from the result document's values.

One style for every method (``_figure`` / ``_finish``): a colour per tier or net
(``colour``), integer round ticks, costs in M/K with their unit (``cost_formatter``),
the legend outside the axes.  matplotlib with the Agg backend; every function returns
the path it wrote, or ``None`` when the run has nothing to draw.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "colour",
    "cost_formatter",
    "plot_alpha_entropy",
    "plot_dpfnas",
    "plot_fdnas_nets",
    "plot_finetune",
    "plot_frontier",
    "plot_history",
    "plot_points",
    "plot_tiers",
]

#: colour-blind-safe palette (Okabe-Ito): tier / net ``i`` gets ``PALETTE[i % len]``
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000")
#: figure resolution of the plots in a run directory
DPI = 120


def colour(index: int) -> str:
    """The colour of tier / net ``index`` (0-based), the same in every plot."""
    return PALETTE[index % len(PALETTE)]


def si(value: float, unit: str = "") -> str:
    """``value`` in G, M or K (three significant figures) followed by ``unit``."""
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{prefix}{unit}"
    return f"{value:.3g}{unit}"


def cost_formatter(unit: str) -> Any:
    """A tick formatter writing costs as ``1.2M`` / ``350K`` followed by ``unit``."""
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda value, _pos: si(value, unit))


def _figure(width: float = 6.5, height: float = 4.0, rows: int = 1) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(rows, 1, figsize=(width, height), sharex=True, squeeze=False)
    for ax in axes[:, 0]:
        ax.grid(alpha=0.3)
    return fig, axes[0, 0] if rows == 1 else list(axes[:, 0])


def integer_ticks(ax: Any) -> None:
    """Integer ticks only on the x axis (rounds, iterations)."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _finish(
    fig: Any, ax: Any, path: Path, *, title: str, xlabel: str, ylabel: str, legend: bool = True
) -> Path:
    """Labels, the legend right of the axes (if any entry), save, close."""
    import matplotlib.pyplot as plt

    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    fig.suptitle(title, fontsize=11)
    handles, _labels = ax.get_legend_handles_labels()
    if legend and handles:
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return Path(path)


def _label(ax: Any, x: float, y: float, text: str, color: str, where: str = "above") -> None:
    """``text`` beside the point ``(x, y)``: ``above`` right, ``below`` right, ``right`` or
    ``left`` (above left)."""
    offset, align = {
        "above": ((6, 5), "left"),
        "below": ((6, -13), "left"),
        "right": ((10, -3), "left"),
    }.get(where, ((-6, 5), "right"))
    ax.annotate(
        text, (x, y), xytext=offset, textcoords="offset points", fontsize=9, color=color, ha=align
    )


def _pad_y(ax: Any, values: Sequence[float]) -> None:
    """A y range with room for the point labels (accuracies of a tiny run can all be equal)."""
    low, high = min(values), max(values)
    pad = max(0.08 * (high - low), 0.02)
    ax.set_ylim(low - pad, high + 2 * pad)


def dodge(index: int, count: int, width: float = 0.12) -> float:
    """The x shift of curve ``index`` of ``count`` drawn on shared integer steps: curves with
    equal values sit side by side instead of one hiding the other."""
    return 0.0 if count < 2 else width * (index / (count - 1) - 0.5)


def _legend_outside(ax: Any, handles: Sequence[Any]) -> None:
    ax.legend(
        handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0, fontsize=9
    )


# --- generic ----------------------------------------------------------------------------


def plot_history(
    path: Path,
    history: Sequence[Mapping[str, Any]],
    key: str,
    *,
    title: str,
    ylabel: str,
    step: str = "round",
) -> Path | None:
    """Line of ``key`` over ``step`` (round or iteration); ``None`` if no entry has it."""
    points = [(h[step], h[key]) for h in history if h.get(key) is not None]
    if not points:
        return None
    fig, ax = _figure(5.5, 3.5)
    ax.plot(*zip(*points, strict=True), marker="o", color=colour(0))
    integer_ticks(ax)
    return _finish(fig, ax, path, title=title, xlabel=step, ylabel=ylabel)


def plot_points(
    path: Path,
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
) -> Path | None:
    """One marked line per named series of ``(x, y)`` points; ``None`` if none has a point."""
    series = {name: sorted(points) for name, points in series.items() if points}
    if not series:
        return None
    fig, ax = _figure()
    for index, (name, points) in enumerate(series.items()):
        ax.plot(*zip(*points, strict=True), marker="o", label=name, color=colour(index))
    return _finish(fig, ax, path, title=title, xlabel=xlabel, ylabel=ylabel)


# --- FedorAS ----------------------------------------------------------------------------

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


def plot_tiers(path: Path, models: Sequence[Mapping[str, Any]]) -> Path | None:
    """FedorAS: test accuracy against MFLOPs, one point per tier model labelled T1..Tn,
    filled for supernet init, hollow for random init.  ``models``: the result's
    ``models`` (``tier`` 1-based, ``init``, ``flops``, ``test.accuracy``)."""
    tested = [m for m in models if m.get("test")]
    if not tested:
        return None
    fig, ax = _figure()
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
            _label(ax, x, y, f"T{tier}", c)
    _legend_outside(ax, handles)
    _pad_y(ax, [m["test"]["accuracy"] for m in tested])
    ax.set_xmargin(0.12)
    return _finish(
        fig,
        ax,
        path,
        title="FedorAS: test accuracy per tier",
        xlabel="MFLOPs per sample",
        ylabel="test accuracy",
        legend=False,
    )


def plot_finetune(path: Path, models: Sequence[Mapping[str, Any]]) -> Path | None:
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

    fig, ax = _figure(7.0, 4.0)
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
    _legend_outside(ax, handles)
    integer_ticks(ax)
    return _finish(
        fig,
        ax,
        path,
        title="FedorAS Stage 3: fine-tuning (server validation)",
        xlabel="fine-tuning round",
        ylabel="validation accuracy",
        legend=False,
    )


# --- DecNAS -----------------------------------------------------------------------------


def plot_frontier(path: Path, document: Mapping[str, Any], variant: str = "") -> Path | None:
    """DecNAS (``variant``): test accuracy against MACs of GM_0..GM_T (each labelled), after
    FL tuning, and the width-multiplier baseline.  ``document``: ``DecNASResult.summary()``."""
    frontier = document.get("frontier", ())
    series = [
        ("GM$_t$", "test-accuracy", "-", "o", True),
        ("GM$_t$, FL-tuned", "tuned-test-accuracy", "--", "s", False),
    ]
    drawn: list[float] = []
    fig, ax = _figure()
    for index, (name, key, style, marker, filled) in enumerate(series):
        points = sorted(
            (m["macs"], m[key], m["iteration"]) for m in frontier if m.get(key) is not None
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
            _label(ax, x, y, f"GM$_{{{t}}}$", c, "below" if filled else "left")
        drawn += [p[1] for p in points]
    baseline = sorted(
        (r["macs"], r["test-accuracy"])
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
    _pad_y(ax, drawn)
    ax.set_xmargin(0.12)
    ax.xaxis.set_major_formatter(cost_formatter(""))
    return _finish(
        fig,
        ax,
        path,
        title=f"DecNAS{f' ({variant})' if variant else ''}: test accuracy against cost",
        xlabel="MACs per sample",
        ylabel="test accuracy",
    )


# --- FDNAS / CFDNAS ---------------------------------------------------------------------


def plot_fdnas_nets(
    path: Path,
    nets: Sequence[Mapping[str, Any]],
    baseline: Mapping[str, float] | None = None,
    method: str = "FDNAS",
) -> Path | None:
    """FDNAS / CFDNAS: each derived net's federated-averaged test accuracy (filled) and
    mean local accuracy (hollow) against MFLOPs, labelled with its name; ``baseline``
    (``{"name", "flops", "accuracy"}``, optional) a fixed net drawn as a star."""
    nets = [n for n in nets if n.get("partitions")]
    if not nets:
        return None
    from matplotlib.lines import Line2D

    fig, ax = _figure()
    drawn: list[float] = []
    handles = []
    for index, net in enumerate(nets):
        c, x = colour(index), net["flops"] / 1e6
        y = net["averaged-accuracy"]
        ax.scatter(x, y, s=50, color=c, zorder=4)  # on top: an equal local ring stays around it
        _label(ax, x, y, net["name"], c, "right")
        handles.append(Line2D([], [], marker="o", linestyle="", color=c, label=net["name"]))
        drawn.append(y)
        local = net.get("mean-local-accuracy")
        if local is not None:
            ax.scatter(x, local, s=150, facecolors="none", edgecolors=c, linewidths=1.5, zorder=3)
            ax.plot([x, x], [y, local], color=c, alpha=0.4, zorder=2)
            drawn.append(local)
    handles.append(Line2D([], [], marker="o", linestyle="", color="0.3", label="averaged"))
    handles.append(
        Line2D(
            [],
            [],
            marker="o",
            markersize=11,
            linestyle="",
            color="0.3",
            markerfacecolor="none",
            label="mean local",
        )
    )
    if baseline is not None:
        ax.scatter(baseline["flops"] / 1e6, baseline["accuracy"], marker="*", s=160, color="0.2")
        _label(ax, baseline["flops"] / 1e6, baseline["accuracy"], str(baseline["name"]), "0.2")
        handles.append(
            Line2D(
                [],
                [],
                marker="*",
                markersize=12,
                linestyle="",
                color="0.2",
                label=f"{baseline['name']} (fixed)",
            )
        )
        drawn.append(baseline["accuracy"])
    _legend_outside(ax, handles)
    _pad_y(ax, drawn)
    costs = [n["flops"] / 1e6 for n in nets] + ([baseline["flops"] / 1e6] if baseline else [])
    ax.set_xlim(0, 1.25 * max(costs))  # from zero: one net alone gets readable ticks
    return _finish(
        fig,
        ax,
        path,
        title=f"{method}: derived nets, test accuracy against cost",
        xlabel="MFLOPs per sample",
        ylabel="test accuracy",
        legend=False,
    )


def plot_alpha_entropy(
    path: Path,
    search_history: Sequence[Mapping[str, Any]],
    cluster_history: Mapping[Any, Sequence[Mapping[str, Any]]] | None = None,
    options: Sequence[int] = (),
    method: str = "FDNAS",
) -> Path | None:
    """FDNAS / CFDNAS: mean entropy of softmax(alpha) over the searchable layers per
    round (band: the least and most decided layer), for the global search and then each
    cluster's (its rounds counted on after the global search's last); ``options``
    (options per layer) draws the undecided (uniform) level."""
    stages = [("global search", search_history)]
    stages += [(f"cluster {tag}", h) for tag, h in sorted((cluster_history or {}).items())]
    rows = [
        [(h["round"], h["alpha-entropy"]) for h in history if h.get("alpha-entropy")]
        for _, history in stages
    ]
    if not any(rows):
        return None
    offset = max((r for r, _ in rows[0]), default=0)
    fig, ax = _figure()
    for index, ((name, _), stage) in enumerate(zip(stages, rows, strict=True)):
        if not stage:
            continue
        shift = (offset if index else 0) + (dodge(index - 1, len(stages) - 1) if index else 0)
        rounds = [r + shift for r, _ in stage]
        c = colour(index)
        ax.plot(
            rounds,
            [sum(e) / len(e) for _, e in stage],
            marker="os^Dv<>"[index % 7],
            color=c,
            label=f"{name} (last {sum(stage[-1][1]) / len(stage[-1][1]):.3f})",
        )
        ax.fill_between(
            rounds,
            [min(e) for _, e in stage],
            [max(e) for _, e in stage],
            color=c,
            alpha=0.12,
            linewidth=0,
        )
    if len(stages) > 1 and rows[0]:
        ax.axvline(offset + 0.5, color="0.6", linewidth=1)
    top = max(max(e) for stage in rows for _, e in stage)
    if options:
        uniform = sum(math.log(k) for k in options) / len(options)
        ax.axhline(uniform, color="0.4", linestyle=":", label="undecided (uniform)")
        top = max(top, uniform)
    ax.set_ylim(0, 1.12 * top)
    integer_ticks(ax)
    return _finish(
        fig,
        ax,
        path,
        title=f"{method}: architecture entropy (mean over layers, band: min..max)",
        xlabel="search round" + (" (clusters after the global search)" if len(stages) > 1 else ""),
        ylabel="entropy of softmax(alpha) [nats]",
    )


# --- DP-FNAS ----------------------------------------------------------------------------


def plot_dpfnas(
    path: Path, history: Sequence[Mapping[str, Any]], target_epsilon: float = 0.0
) -> Path | None:
    """DP-FNAS: the worst party's epsilon (top) and the mixed supernet's validation
    accuracy (bottom) per iteration; ``target_epsilon`` > 0 draws the stopping target."""
    # epsilon is inf without noise (modes fnas / single, or sigma = 0): nothing to draw
    spent = [(h["iteration"], h["epsilon"]) for h in history if h.get("epsilon") is not None]
    epsilon = [(i, e) for i, e in spent if math.isfinite(e)]
    accuracy = [
        (h["iteration"], h["val-accuracy"]) for h in history if h.get("val-accuracy") is not None
    ]
    if not spent and not accuracy:
        return None
    fig, (top, bottom) = _figure(6.5, 5.0, rows=2)
    if epsilon:
        top.plot(*zip(*epsilon, strict=True), marker="o", color=colour(5), label="epsilon")
        _label(top, *epsilon[-1], f"{epsilon[-1][1]:.3g}", colour(5), "left")
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
    if accuracy:
        bottom.plot(*zip(*accuracy, strict=True), marker="o", color=colour(0))
    else:
        bottom.text(
            0.5,
            0.5,
            "no server validation in this run",
            ha="center",
            transform=bottom.transAxes,
            color="0.4",
        )
    integer_ticks(bottom)
    return _finish(
        fig,
        bottom,
        path,
        title="DP-FNAS: privacy spent and supernet accuracy",
        xlabel="iteration",
        ylabel="validation accuracy",
        legend=False,
    )
