"""The leaderboard of a comparison: one row per method and cost point (each final model
of each run's result.json: ``methods.points_function``), the budget each method spent
(from its ledger), written as ``leaderboard.json``, ``leaderboard.md`` and
``leaderboard.png`` (global-test accuracy against cost, in the project's plot style)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from logging import WARNING
from pathlib import Path
from typing import Any

from flwr.common.logger import log

from ..artifacts import write_json
from ..costs import COST_CONVENTION, macs_to_flops
from ..methods import points_function
from ..plots import PALETTE, accuracy_axis, figure, finish, flops_axis
from ..progress import fmt

__all__ = [
    "CHANCE_FACTOR",
    "MARKERS",
    "client_flops",
    "flag_near_chance",
    "ledger_totals",
    "pareto",
    "rows_of",
    "write_leaderboard",
]

#: a model whose accuracy is within this multiple of chance is flagged (issue 40): a user is
#: never shown a model that learnt next to nothing as a result without a warning
CHANCE_FACTOR = 1.5

#: one marker and colour per method (the plots' palette and a brown: eight methods)
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
COLOURS = (*PALETTE, "#8C564B")


def ledger_totals(document: Mapping[str, Any]) -> dict[str, int]:
    """``bytes_up``, ``bytes_down`` and ``train_flops`` (the clients' training FLOPs)
    summed over every stage of result.json's ``ledger``."""
    totals = {"bytes_up": 0, "bytes_down": 0, "train_flops": 0}
    for stage in (document.get("ledger") or {}).values():
        for key in totals:
            totals[key] += int((stage.get("totals") or {}).get(key, 0))
    return totals


def client_flops(document: Mapping[str, Any]) -> int:
    """The clients' training FLOPs of a run (its ledger, every stage)."""
    return ledger_totals(document)["train_flops"]


def rows_of(method: str, document: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each cost point of ``method``'s result ``document``, with the method's name."""
    return [{"method": method, **point} for point in points_function(method)(document)]


def accuracy_key(rows: Sequence[Mapping[str, Any]]) -> str:
    """What ranks the rows: the global test set's accuracy when any row has one (the
    same test data for every method), else the clients' test accuracy."""
    if any(r.get("global_test_accuracy") is not None for r in rows):
        return "global_test_accuracy"
    return "test_accuracy"


def pareto(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """``rows`` cheapest first (MACs; rows without MACs last), each with ``best_at_cost``:
    true when no row of the same or lower MACs reaches its ``key`` accuracy or more
    (the best model at that cost: the frontier a reader picks from)."""
    ordered = sorted(
        rows,
        key=lambda r: (
            r.get("macs") is None,
            r.get("macs") or 0,
            -(r.get(key) if r.get(key) is not None else -1.0),
        ),
    )
    best = -1.0
    for row in ordered:
        value = row.get(key)
        row["best_at_cost"] = row.get("macs") is not None and value is not None and value > best
        if row["best_at_cost"]:
            best = value
    return ordered


def flag_near_chance(
    rows: list[dict[str, Any]], key: str, chance: float | None
) -> list[dict[str, Any]]:
    """Mark each row ``near_chance``: its ``key`` accuracy is at most :data:`CHANCE_FACTOR`
    x ``chance`` (None where either is unknown); log a WARNING per flagged row, naming the
    method and the model. Returns the flagged rows."""
    flagged = []
    for row in rows:
        value = row.get(key)
        row["near_chance"] = (
            None
            if chance is None or value is None
            else bool(value <= CHANCE_FACTOR * chance + 1e-9)
        )
        if row["near_chance"]:
            flagged.append(row)
            log(
                WARNING,
                "leaderboard: %s's model %s is near chance (%s %.3f <= %.1f x chance %.3f): "
                "it learnt next to nothing at these settings; more rounds (rounds-scale, a "
                "number > 1: docs/running.md) or a lower lr",
                row["method"],
                row.get("model"),
                key,
                value,
                CHANCE_FACTOR,
                chance,
            )
    return flagged


def write_leaderboard(
    out: Path,
    header: Mapping[str, Any],
    methods: Sequence[Mapping[str, Any]],
    rows: list[dict[str, Any]],
    chance: float | None,
) -> dict[str, Any]:
    """Write ``leaderboard.json``, ``leaderboard.md`` and ``leaderboard.png`` in ``out``;
    returns the JSON's content. ``header``: the setting and the budget rule;
    ``methods``: one entry per method (its run, budget spent, status)."""
    key = accuracy_key(rows)
    ordered = pareto(rows, key)
    near_chance = flag_near_chance(ordered, key, chance)
    order = [m["method"] for m in methods]
    plot = plot_leaderboard(out / "leaderboard.png", ordered, chance, order)
    content = {
        **header,
        "ranked_by": key,
        "units": {
            "macs": "MACs of one sample (the papers' FLOPs)",
            "flops": COST_CONVENTION,
            "client_train_flops": "FLOPs the clients spent training (ledger: 3 x forward "
            "FLOPs x samples), every stage",
            "bytes": "serialized arrays of the messages, every stage",
            "latency_ms": "milliseconds on the nodes' measured latency tables",
        },
        "methods": list(methods),
        "chance": chance,
        "near_chance": [f"{r['method']} {r.get('model')}" for r in near_chance],
        "rows": ordered,
        "plot": None if plot is None else plot.name,
    }
    write_json(out / "leaderboard.json", content)
    (out / "leaderboard.md").write_text(markdown(content))
    return content


def _cell(value: Any, scale: float = 1.0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float | int) and not isinstance(value, bool):
        return fmt(value / scale)
    return " ".join(str(value).split()).replace("|", "/")  # one line: a table row


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(" --- " for _ in header) + "|",
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def markdown(content: Mapping[str, Any]) -> str:
    """``leaderboard.md``: the setting and budget rule, the budget each method spent, then
    every model cheapest first, the best at its cost marked."""
    budget = content["budget"]
    lines = [
        "# Leaderboard",
        "",
        f"- setting: {content['setting_text']}",
        f"- engine: {content['engine']}; {content['nodes']} clients",
        f"- **budget rule: {budget['rule']}**: {budget['statement']}",
        f'- ranked by: `{content["ranked_by"]}`; MACs of one sample (the papers\' "FLOPs"), '
        "FLOPs = 2 x MACs; client training FLOPs from each run's ledger",
        "",
        "## Budget spent per method",
        "",
    ]
    header = [
        "method",
        "status",
        "client train GFLOPs",
        "x reference",
        "rounds",
        "MB up",
        "MB down",
        "run s",
        "wall s",
        "engine",
        "note",
    ]
    rows = []
    for m in content["methods"]:
        rounds = ", ".join(f"{k}={v}" for k, v in (m.get("rounds") or {}).items())
        rows.append(
            [
                m["method"],
                m["status"],
                _cell(m.get("client_train_flops"), 1e9),
                _cell(m.get("flops_ratio")),
                rounds or "-",
                _cell(m.get("bytes_up"), 1e6),
                _cell(m.get("bytes_down"), 1e6),
                _cell(m.get("run_seconds")),
                _cell(m.get("wall_seconds")),
                m.get("engine") or "-",
                _cell("; ".join(str(t) for t in (m.get("note"), m.get("reason")) if t)),
            ]
        )
    lines += _table(header, rows)
    lines += [
        "",
        "## Models, cheapest first",
        "",
        "`*`: the best model at its cost (no model of the same or fewer MACs is as accurate "
        f"by `{content['ranked_by']}`). Clients' test accuracy pools the test splits the "
        "scope names; the global test set is the same for every method. " + _chance_note(content),
        "",
    ]
    header = [
        "",
        "method",
        "model",
        "MMACs",
        "MFLOPs",
        "global test acc",
        "clients' test acc",
        "test scope",
        "latency ms",
        "epsilon",
        "near chance",
    ]
    rows = [
        [
            "*" if r.get("best_at_cost") else "",
            r["method"],
            _cell(r["model"]),
            _cell(r.get("macs"), 1e6),
            _cell(r.get("flops"), 1e6),
            _cell(r.get("global_test_accuracy")),
            _cell(r.get("test_accuracy")),
            _cell(r.get("test_scope")),
            _cell(r.get("latency_ms")),
            _cell(r.get("epsilon")),
            "**WARNING**" if r.get("near_chance") else "",
        ]
        for r in content["rows"]
    ]
    lines += _table(header, rows)
    if content.get("plot"):
        lines += ["", f"![accuracy against cost]({content['plot']})"]
    return "\n".join(lines) + "\n"


def _chance_note(content: Mapping[str, Any]) -> str:
    chance = content.get("chance")
    if chance is None:
        return ""
    note = (
        f"Chance is {fmt(chance)}; **WARNING** marks a model within {CHANCE_FACTOR} x chance "
        f"({fmt(CHANCE_FACTOR * chance)}): it learnt next to nothing."
    )
    if content.get("near_chance"):
        note += " Near chance here: " + ", ".join(content["near_chance"]) + "."
    return note


def plot_leaderboard(
    path: Path,
    rows: Sequence[Mapping[str, Any]],
    chance: float | None,
    methods: Sequence[str] = (),
) -> Path | None:
    """Every model's global-test accuracy against its MFLOPs per sample (log scale; MMACs
    on top), one colour and marker per method (in the order of ``methods``, then any
    other), the number of its models in the legend; ``None`` when no model has both."""
    series: dict[str, list[tuple[float, float]]] = {m: [] for m in methods}
    for r in rows:
        if r.get("macs") is not None and r.get("global_test_accuracy") is not None:
            point = (macs_to_flops(r["macs"]) / 1e6, r["global_test_accuracy"])
            series.setdefault(r["method"], []).append(point)
    if not any(series.values()):
        return None
    from matplotlib.ticker import FuncFormatter

    fig, ax = figure(7.5, 4.5)
    ax.set_xscale("log")
    for index, (method, points) in enumerate(series.items()):
        if not points:
            continue
        ax.plot(
            *zip(*sorted(points), strict=True),
            marker=MARKERS[index % len(MARKERS)],
            color=COLOURS[index % len(COLOURS)],
            linestyle="none",  # a method's models are alternatives, not a curve
            markersize=7,
            alpha=0.85,
            label=f"{method} ({len(points)})",
        )
    frontier = [
        (macs_to_flops(r["macs"]) / 1e6, r["global_test_accuracy"])
        for r in rows
        if r.get("best_at_cost") and r.get("global_test_accuracy") is not None
    ]
    if frontier:  # rows are cheapest first: the best accuracy reached at each cost
        ax.step(
            *zip(*frontier, strict=True),
            where="post",
            color="0.55",
            linewidth=1,
            zorder=0,
            label="best at its cost",
        )
    accuracy_axis(ax, chance)
    xlabel = flops_axis(ax)
    plain = FuncFormatter(lambda value, _pos: f"{value:g}")  # 0.1, 1, 10: not 10^-1
    ax.xaxis.set_major_formatter(plain)
    for top in ax.child_axes:  # flops_axis's MMACs axis
        top.xaxis.set_major_formatter(plain)
    return finish(
        fig,
        ax,
        path,
        title="every method's models: global test accuracy against cost",
        xlabel=xlabel,
        ylabel="accuracy on the global test set",
    )
