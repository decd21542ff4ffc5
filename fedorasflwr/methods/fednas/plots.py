"""FedNAS's plots (the shared style: ``fedorasflwr.plots``): the search and the derived net.

- ``plot_fednas_search`` (``search.png``): the alphas' entropy per round, one line per
  architecture variable (normal and reduction cell), and the accuracies of the run: the
  mixed supernet's server validation per search round, the derived net's test accuracy
  per final round, counted on after the search's last;
- ``plot_fednas_net`` (``derived_accuracy_flops.png``): the derived net on accuracy against
  cost (``plots.plot_points``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ... import plots as style
from ...search_spaces.darts import PRIMITIVES, searched_cells

__all__ = ["fednas_plots", "plot_fednas_net", "plot_fednas_search", "unsearched_keys"]

#: an architecture variable's name in a legend (``net.alpha_normal`` -> "normal cell")
CELLS = {"net.alpha_normal": "normal cell", "net.alpha_reduce": "reduction cell"}


def plot_fednas_search(
    path: Path,
    history: Sequence[Mapping[str, Any]],
    final_history: Sequence[Mapping[str, Any]] = (),
    chance: float | None = None,
    options: int = len(PRIMITIVES),
    unsearched: Sequence[str] = (),
) -> Path | None:
    """FedNAS: the mean entropy of softmax(alpha) of each architecture variable per search
    round (top, with the undecided level ln ``options``; a key in ``unsearched``, a cell the
    net does not have, is labelled so) and, below, the supernet's server
    validation accuracy per round and the derived net's test accuracy per final round
    (rounds after the search's last); ``None`` without a round that has either."""
    entropy: dict[str, list[tuple[int, float]]] = {}
    for h in history:
        for key, value in (h.get("alpha-entropy") or {}).items():
            entropy.setdefault(key, []).append((h["round"], value))
    searched = max((h["round"] for h in history), default=0)
    validation = [(h["round"], h["val-accuracy"]) for h in history if h.get("val-accuracy")]
    derived = [
        (searched + h["round"], h["test-accuracy"])
        for h in final_history
        if h.get("test-accuracy") is not None
    ]
    if not entropy and not validation and not derived:
        return None
    fig, (top, bottom) = style.figure(6.5, 5.0, rows=2)
    for index, (key, points) in enumerate(sorted(entropy.items())):
        shift = style.dodge(index, len(entropy))
        top.plot(
            [r + shift for r, _ in points],
            [e for _, e in points],
            marker="os"[index % 2],
            color=style.colour(index),
            label=f"{CELLS.get(key, key)} (last {points[-1][1]:.3f})"
            + (": not in this net, unsearched" if key in unsearched else ""),
        )
    uniform = math.log(options)
    top.axhline(uniform, color="0.4", linestyle=":", label="undecided (uniform)")
    top.set_ylim(0, 1.12 * uniform)
    top.set_ylabel("entropy of\nsoftmax(alpha) [nats]")
    top.legend(fontsize=8, loc="lower left")
    handles = []
    if validation:
        handles += bottom.plot(
            *zip(*validation, strict=True),
            marker="o",
            color=style.colour(0),
            label="mixed supernet, server validation",
        )
    if derived:
        handles += bottom.plot(
            *zip(*derived, strict=True),
            marker="*",
            markersize=10,
            color=style.colour(3),
            label="derived net, clients' test (final rounds)",
        )
        style.label(bottom, *derived[-1], f"{derived[-1][1]:.2f}", style.colour(3), "left")
    if searched and derived:
        bottom.axvline(searched + 0.5, color="0.6", linewidth=1)
    line = style.accuracy_axis(bottom, chance)
    handles += [line] if line is not None else []
    bottom.legend(handles=handles, fontsize=8, loc="upper left")
    style.integer_ticks(bottom)
    return style.finish(
        fig,
        bottom,
        path,
        title="FedNAS: the alphas leaving uniform, and accuracy",
        xlabel="round (search, then the derived net's final training)",
        ylabel="accuracy",
        legend=False,
    )


def plot_fednas_net(
    path: Path, document: Mapping[str, Any], chance: float | None = None
) -> Path | None:
    """The derived net's test accuracy (the clients', the global test set's) against its
    MFLOPs per sample (MMACs on top); ``None`` without its cost or an accuracy."""
    flops = document.get("flops")
    if flops is None:
        return None
    x = flops / 1e6
    series = {
        "clients' test": [(x, document["test-accuracy"])]
        if document.get("test-accuracy") is not None
        else [],
        "global test set": [(x, document["global-test-accuracy"])]
        if document.get("global-test-accuracy") is not None
        else [],
    }
    drawn = [y for points in series.values() for _, y in points]
    return style.plot_points(
        path,
        series,
        title="FedNAS: the derived net, test accuracy against cost",
        xlabel=style.FLOPS_LABEL,
        ylabel="test accuracy",
        accuracy=True,
        chance=chance,
        cost=True,
        names=[(x, max(drawn), "derived net")] if drawn else [],
    )


def unsearched_keys(space: Mapping[str, Any]) -> list[str]:
    """The architecture variables of a darts net's cells it does not have
    (``darts.searched_cells``); none for another space."""
    spec = space.get("spec", {})
    if spec.get("name") != "darts" or "cells" not in spec:
        return []
    kept = searched_cells(int(spec["cells"]))
    return [f"net.alpha_{kind}" for kind in ("normal", "reduce") if kind not in kept]


def fednas_plots(
    out_dir: Path, document: Mapping[str, Any], chance: float | None = None
) -> list[Path | None]:
    """Both plots of a FedNAS run into ``out_dir``, from its result document (the runner's,
    kebab-case keys): ``search.png`` and ``derived_accuracy_flops.png``."""
    return [
        plot_fednas_search(
            out_dir / "search.png",
            document.get("history", []),
            document.get("final-history") or [],
            chance,
            unsearched=unsearched_keys(document.get("space", {})),
        ),
        plot_fednas_net(out_dir / "derived_accuracy_flops.png", document, chance),
    ]
