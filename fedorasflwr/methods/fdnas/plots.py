"""FDNAS and CFDNAS's plots (the shared style: ``fedorasflwr.plots``)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ... import plots as style

__all__ = ["cluster_accuracy", "plot_alpha_entropy", "plot_fdnas_nets", "plot_fdnas_ops"]


def plot_fdnas_nets(
    path: Path,
    nets: Sequence[Mapping[str, Any]],
    baseline: Mapping[str, float] | None = None,
    method: str = "FDNAS",
    chance: float | None = None,
) -> Path | None:
    """FDNAS / CFDNAS: each derived net's federated-averaged test accuracy (filled) and
    mean local accuracy (hollow) against MFLOPs (MMACs on top: ``flops_axis``), labelled
    with its name; with CFDNAS's cluster nets, the FDNAS net's accuracy on each cluster's
    clients (``cluster_accuracy``) as a diamond in the cluster's colour, a dotted line to
    the cluster net: what each cluster gains by its own net. ``baseline``
    (``{"name", "flops", "accuracy"}``, optional) a fixed net drawn as a star."""
    nets = [n for n in nets if n.get("partitions")]
    if not nets:
        return None
    from matplotlib.lines import Line2D

    fig, ax = style.figure()
    drawn: list[float] = []
    handles = []
    for index, net in enumerate(nets):
        c, x = style.colour(index), net["flops"] / 1e6
        y = net["averaged-accuracy"]
        ax.scatter(x, y, s=50, color=c, zorder=4)  # on top: an equal local ring stays around it
        style.label(ax, x, y, net["name"], c, "right")
        handles.append(Line2D([], [], marker="o", linestyle="", color=c, label=net["name"]))
        drawn.append(y)
        local = net.get("mean-local-accuracy")
        if local is not None:
            ax.scatter(x, local, s=150, facecolors="none", edgecolors=c, linewidths=1.5, zorder=3)
            ax.plot([x, x], [y, local], color=c, alpha=0.4, zorder=2)
            drawn.append(local)
    global_net = next((n for n in nets if n["name"] == "fdnas"), None)
    clusters = [n for n in nets if n is not global_net]
    if global_net is not None and clusters:
        # CFDNAS's point: beside each cluster's net, the FDNAS net on that cluster's clients
        gx = global_net["flops"] / 1e6
        for index, net in enumerate(nets):
            if net is global_net:
                continue
            on_cluster = cluster_accuracy(global_net, net["partitions"])
            if on_cluster is None:
                continue
            c = style.colour(index)
            ax.scatter(gx, on_cluster, s=60, marker="D", color=c, alpha=0.55, zorder=4)
            ax.plot(
                [gx, net["flops"] / 1e6],
                [on_cluster, net["averaged-accuracy"]],
                linestyle=":",
                color=c,
                linewidth=1.2,
                zorder=2,
            )
            drawn.append(on_cluster)
        handles.append(
            Line2D(
                [],
                [],
                marker="D",
                linestyle=":",
                color="0.3",
                alpha=0.7,
                label="fdnas net on the\ncluster's clients",
            )
        )
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
        style.label(ax, baseline["flops"] / 1e6, baseline["accuracy"], str(baseline["name"]), "0.2")
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
    line = style.accuracy_axis(ax, chance)
    style.legend_outside(ax, handles + ([line] if line is not None else []))
    costs = [n["flops"] / 1e6 for n in nets] + ([baseline["flops"] / 1e6] if baseline else [])
    ax.set_xlim(0, 1.25 * max(costs))  # from zero: one net alone gets readable ticks
    return style.finish(
        fig,
        ax,
        path,
        title=f"{method}: derived nets, test accuracy against cost",
        xlabel=style.flops_axis(ax),
        ylabel="test accuracy",
        legend=False,
    )


def cluster_accuracy(net: Mapping[str, Any], partitions: Sequence[int]) -> float | None:
    """``net``'s federated-averaged accuracy on ``partitions`` (a cluster's clients): its
    per-partition ``test-accuracy`` weighted by ``test-count`` (keys ints, or the strings
    of result.json); ``None`` when it was tested on none of them."""
    accuracy, count = net.get("test-accuracy") or {}, net.get("test-count") or {}
    pairs = []
    for p in partitions:
        a, n = accuracy.get(p, accuracy.get(str(p))), count.get(p, count.get(str(p)))
        if a is not None and n is not None:
            pairs.append((float(a), int(n)))
    total = sum(n for _, n in pairs)
    return sum(a * n for a, n in pairs) / total if total else None


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
    fig, ax = style.figure()
    for index, ((name, _), stage) in enumerate(zip(stages, rows, strict=True)):
        if not stage:
            continue
        shift = (offset if index else 0) + (style.dodge(index - 1, len(stages) - 1) if index else 0)
        rounds = [r + shift for r, _ in stage]
        c = style.colour(index)
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
    style.integer_ticks(ax)
    return style.finish(
        fig,
        ax,
        path,
        title=f"{method}: architecture entropy (mean over layers, band: min..max)",
        xlabel="search round" + (" (clusters after the global search)" if len(stages) > 1 else ""),
        ylabel="entropy of softmax(alpha) [nats]",
    )


def plot_fdnas_ops(
    path: Path, nets: Sequence[Mapping[str, Any]], method: str = "FDNAS"
) -> Path | None:
    """FDNAS / CFDNAS: the operation each derived net chose, layer by layer (one row per
    net, one column per searchable layer, each operation in its colour and named in its
    cell); ``None`` when no net has ``options``."""
    nets = [n for n in nets if n.get("options")]
    if not nets:
        return None
    import numpy as np
    from matplotlib.colors import ListedColormap

    ops = sorted({op for n in nets for op in n["options"]})
    layers = max(len(n["options"]) for n in nets)
    grid = [
        [ops.index(op) for op in n["options"]] + [-1] * (layers - len(n["options"])) for n in nets
    ]
    fig, ax = style.figure(max(6.5, 1.1 * layers + 2.0), 0.9 * len(nets) + 1.6)
    ax.grid(False)
    cells = np.ma.masked_less(np.asarray(grid), 0)
    ax.imshow(
        cells,
        cmap=ListedColormap([style.colour(i) for i in range(len(ops))]),
        vmin=-0.5,
        vmax=len(ops) - 0.5,
        aspect="auto",
        alpha=0.55,
    )
    for row, net in enumerate(nets):
        for column, op in enumerate(net["options"]):
            ax.text(column, row, op.replace("_", "\n", 1), ha="center", va="center", fontsize=7)
    ax.set_xticks(np.arange(-0.5, layers), minor=True)  # white borders between cells
    ax.set_yticks(np.arange(-0.5, len(nets)), minor=True)
    ax.grid(which="minor", color="white", linewidth=2)
    ax.tick_params(which="minor", length=0)
    ax.set_yticks(range(len(nets)), [n["name"] for n in nets])
    ax.set_xticks(range(layers), [str(i + 1) for i in range(layers)])
    return style.finish(
        fig,
        ax,
        path,
        title=f"{method}: the operation chosen per layer",
        xlabel="searchable layer",
        ylabel="net",
        legend=False,
    )
