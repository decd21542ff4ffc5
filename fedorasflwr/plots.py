"""The plots a run writes beside ``result.json``, drawn from the result document's values:
the style and the generic plots; each method's own plots are in ``methods/<method>/plots.py``.

One style for every method (``figure`` / ``finish``): a colour per tier or net
(``colour``), integer round ticks, costs in M/K with their unit (``cost_formatter``),
the legend outside the axes.  One rule for every plot against cost (``flops_axis``): the
x axis in MFLOPs per sample (``torch.utils.flop_counter``: 2 x MACs) and a second x axis
on top in MMACs, the unit the papers call "FLOPs".  matplotlib with the Agg backend;
every function returns the path it wrote, or ``None`` when the run has nothing to draw.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .costs import flops_to_macs, macs_to_flops

__all__ = [
    "ACCURACY_LIMITS",
    "FLOPS_LABEL",
    "MACS_LABEL",
    "accuracy_axis",
    "colour",
    "cost_formatter",
    "dodge",
    "figure",
    "finish",
    "flops_axis",
    "integer_ticks",
    "label",
    "legend_outside",
    "pad_y",
    "plot_history",
    "plot_points",
    "si",
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


def figure(width: float = 6.5, height: float = 4.0, rows: int = 1) -> tuple[Any, Any]:
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


def finish(
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


def label(ax: Any, x: float, y: float, text: str, color: str, where: str = "above") -> None:
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


def pad_y(ax: Any, values: Sequence[float]) -> None:
    """A y range with room for the point labels (accuracies of a tiny run can all be equal)."""
    low, high = min(values), max(values)
    pad = max(0.08 * (high - low), 0.02)
    ax.set_ylim(low - pad, high + 2 * pad)


#: the y range of every accuracy axis: the whole of [0, 1] (room above for point labels), so
#: that noise around chance never fills the plot as a peak would
ACCURACY_LIMITS = (0.0, 1.08)


def accuracy_axis(ax: Any, chance: float | None) -> Any:
    """An accuracy axis: the y range ``ACCURACY_LIMITS`` and, given ``chance`` (1 / the
    number of classes), a dotted grey line there; returns that line (for a legend) or
    ``None``."""
    ax.set_ylim(*ACCURACY_LIMITS)
    if chance is None:
        return None
    return ax.axhline(
        chance, linestyle=":", color="0.45", linewidth=1.2, label=f"chance ({chance:.3g})"
    )


#: the label of every cost axis (x values: millions of FLOPs of one sample) ...
FLOPS_LABEL = "MFLOPs per sample (= 2 x MACs)"
#: ... and of the MACs axis on top of it
MACS_LABEL = 'MMACs per sample (the papers\' "FLOPs")'


def flops_axis(ax: Any) -> str:
    """Make ``ax``'s x axis, whose values are MFLOPs of one sample, a cost axis: a second x
    axis on top in MMACs (``MACS_LABEL``); returns the x label to set (``FLOPS_LABEL``)."""
    top = ax.secondary_xaxis("top", functions=(flops_to_macs, macs_to_flops))
    top.set_xlabel(MACS_LABEL, fontsize=9)
    top.tick_params(labelsize=8)
    return FLOPS_LABEL


def dodge(index: int, count: int, width: float = 0.12) -> float:
    """The x shift of curve ``index`` of ``count`` drawn on shared integer steps: curves with
    equal values sit side by side instead of one hiding the other."""
    return 0.0 if count < 2 else width * (index / (count - 1) - 0.5)


def legend_outside(ax: Any, handles: Sequence[Any]) -> None:
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
    chance: float | None = None,
) -> Path | None:
    """Line of ``key`` over ``step`` (round or iteration); ``None`` if no entry has it.
    ``chance`` given: ``key`` is an accuracy (``accuracy_axis``)."""
    points = [(h[step], h[key]) for h in history if h.get(key) is not None]
    if not points:
        return None
    fig, ax = figure(5.5, 3.5)
    ax.plot(*zip(*points, strict=True), marker="o", color=colour(0))
    if chance is not None:
        accuracy_axis(ax, chance)
    integer_ticks(ax)
    return finish(fig, ax, path, title=title, xlabel=step, ylabel=ylabel)


def plot_points(
    path: Path,
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    accuracy: bool = False,
    chance: float | None = None,
    cost: bool = False,
    names: Sequence[tuple[float, float, str]] = (),
) -> Path | None:
    """One marked line per named series of ``(x, y)`` points; ``None`` if none has a point.
    ``accuracy``: y is an accuracy (``accuracy_axis``: [0, 1], a line at ``chance``);
    ``cost``: x is MFLOPs per sample (``flops_axis``: MMACs on top, ``xlabel`` ignored),
    from 0 (a single point, or close costs, get readable ticks); ``names``: ``(x, y,
    text)``, each text written beside its point (which tier, width or net it is)."""
    series = {name: sorted(points) for name, points in series.items() if points}
    if not series:
        return None
    fig, ax = figure()
    for index, (name, points) in enumerate(series.items()):
        ax.plot(*zip(*points, strict=True), marker="o", label=name, color=colour(index))
    for x, y, text in names:
        label(ax, x, y, text, "0.2")
    if accuracy:
        accuracy_axis(ax, chance)
    if cost:
        xlabel = flops_axis(ax)
        ax.set_xlim(0, 1.2 * max(x for points in series.values() for x, _ in points))
    return finish(fig, ax, path, title=title, xlabel=xlabel, ylabel=ylabel)
