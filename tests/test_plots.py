"""The plots a run writes: each plot function draws a PNG from a small hand-made result
(no federated run), and a tiny in-process FDNAS run lists its plots beside result.json."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from flwr.app import Context, RecordDict
from PIL import Image

from fedorasflwr.artifacts import plot_history as reexported_plot_history
from fedorasflwr.client_app import app as client_app
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.methods.decnas.plots import plot_frontier
from fedorasflwr.methods.dpfnas.plots import plot_dpfnas
from fedorasflwr.methods.fdnas.plots import plot_alpha_entropy, plot_fdnas_nets, plot_fdnas_ops
from fedorasflwr.methods.fedoras.plots import plot_finetune, plot_tiers
from fedorasflwr.plots import cost_formatter, plot_history, plot_points, si
from fedorasflwr.server_app import main
from tests.runconfig import tiny_fdnas

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png(path: Path | None) -> None:
    """``path`` is a non-empty PNG image of a plausible plot size."""
    assert path is not None
    assert path.read_bytes()[:8] == PNG_MAGIC
    with Image.open(path) as image:
        width, height = image.size
    assert width >= 400 and height >= 250


def tier_models() -> list[dict[str, Any]]:
    """Four tiers, each fine-tuned from the supernet and from a random init."""
    models = []
    for tier in range(1, 5):
        for init, gain in (("supernet", 0.1), ("random", 0.0)):
            models.append(
                {
                    "tier": tier,
                    "init": init,
                    "flops": 2_000_000 * tier,
                    "test": {"accuracy": 0.5 + 0.05 * tier + gain, "loss": 1.0},
                    "history": [
                        {"round": r, "val-accuracy": 0.3 + 0.1 * r + gain} for r in (1, 2, 3)
                    ],
                }
            )
    return models


def test_si_units():
    assert si(1_234_567, "FLOPs") == "1.23MFLOPs"
    assert si(350_000) == "350K"
    assert si(12) == "12"
    assert cost_formatter("")(2_500_000, 0) == "2.5M"


def test_generic_plots(tmp_path):
    history = [{"round": r, "val-accuracy": 0.1 * r} for r in (1, 2, 3)]
    assert_png(plot_history(tmp_path / "h.png", history, "val-accuracy", title="t", ylabel="y"))
    assert plot_history(tmp_path / "none.png", history, "loss", title="t", ylabel="y") is None
    assert reexported_plot_history is plot_history  # artifacts keeps its old import working
    assert_png(
        plot_points(tmp_path / "p.png", {"a": [(1, 2), (3, 4)]}, title="t", xlabel="x", ylabel="y")
    )
    assert plot_points(tmp_path / "e.png", {"a": []}, title="t", xlabel="x", ylabel="y") is None


def test_fedoras_plots(tmp_path):
    models = tier_models()
    assert_png(plot_tiers(tmp_path / "tiers.png", models))
    assert_png(plot_finetune(tmp_path / "curves.png", models))
    untested = [{**m, "test": None, "history": []} for m in models]
    assert plot_tiers(tmp_path / "t0.png", untested) is None
    assert plot_finetune(tmp_path / "c0.png", untested) is None


def test_frontier_plot(tmp_path):
    document = {
        "frontier": [
            {
                "iteration": t,
                "macs": 400_000 // (t + 1),
                "test-accuracy": 0.9 - 0.1 * t,
                "tuned-test-accuracy": None if t == 0 else 0.95 - 0.1 * t,
            }
            for t in range(3)
        ],
        "width-baseline": [{"macs": 150_000, "test-accuracy": 0.6}],
    }
    assert_png(plot_frontier(tmp_path / "frontier.png", document, "decnas"))
    assert plot_frontier(tmp_path / "none.png", {"frontier": [], "width-baseline": []}) is None


def test_fdnas_plots(tmp_path):
    nets = [
        {
            "name": "fdnas",
            "flops": 300_000,
            "partitions": [0, 1, 2, 3],
            "averaged-accuracy": 0.8,
            "mean-local-accuracy": 0.85,
        },
        {
            "name": "cluster-0",
            "flops": 200_000,
            "partitions": [0, 1],
            "averaged-accuracy": 0.75,
            "mean-local-accuracy": None,
        },
    ]
    baseline = {"name": "MobileNetV2", "flops": 250_000, "accuracy": 0.7}
    assert_png(plot_fdnas_nets(tmp_path / "nets.png", nets, baseline))
    assert plot_fdnas_nets(tmp_path / "n0.png", [{**nets[0], "partitions": []}]) is None
    chosen = [{**nets[0], "options": ["mbconv_k3_e3", "identity"]}, {**nets[1], "options": []}]
    assert_png(plot_fdnas_ops(tmp_path / "ops.png", chosen, "CFDNAS"))
    assert plot_fdnas_ops(tmp_path / "ops0.png", [{**nets[0], "options": []}]) is None
    history = [{"round": r, "alpha-entropy": [math.log(6) / r, 0.5 / r]} for r in (1, 2, 3)]
    clusters = {0: history[:2], 1: history[:2]}
    assert_png(plot_alpha_entropy(tmp_path / "entropy.png", history, clusters, options=[6, 6]))
    assert plot_alpha_entropy(tmp_path / "e0.png", [{"round": 1}], {}) is None


def test_dpfnas_plot(tmp_path):
    history = [{"iteration": 0, "val-accuracy": 0.1}] + [
        {"iteration": i, "epsilon": 0.5 * i, "val-accuracy": 0.1 + 0.05 * i} for i in (1, 2, 3)
    ]
    assert_png(plot_dpfnas(tmp_path / "dp.png", history, target_epsilon=2.0))
    no_validation = [{k: v for k, v in h.items() if k != "val-accuracy"} for h in history[1:]]
    assert_png(plot_dpfnas(tmp_path / "dp2.png", no_validation))
    assert plot_dpfnas(tmp_path / "none.png", [{"iteration": 0}]) is None


def test_fdnas_run_writes_its_plots(data_cache, tmp_path):
    """A tiny real FDNAS run (ServerApp main, in-process grid): the plots are beside
    result.json, listed in its ``files``, and every search round records alpha entropies."""
    config = {**tiny_fdnas(data_cache, **{"fdnas.rounds": 2}), "output-dir": str(tmp_path)}
    context = Context(run_id=3, node_id=0, node_config={}, state=RecordDict(), run_config=config)
    main(InProcessGrid(client_app, config, 10), context)
    (run_dir,) = tmp_path.iterdir()
    result = json.loads((run_dir / "result.json").read_text())
    for name in ("nets_accuracy_flops.png", "alpha_entropy.png", "nets_operations.png"):
        assert name in result["files"]
        assert_png(run_dir / name)
    # every FLOPs count has its MACs (FLOPs / 2, the papers' "FLOPs") beside it
    assert "2 x MACs" in result["flops_convention"]
    space = result["space"]
    for bound in ("fixed", "min", "max"):
        assert space[f"{bound}_macs"] == space[f"{bound}_flops"] // 2 > 0
    assert result["nets"] and all(n["macs"] * 2 == n["flops"] for n in result["nets"])
    layers = len(result["space"]["choices"])
    for entry in result["search_history"]:
        assert entry["derived_macs"] * 2 == entry["derived_flops"]
        assert entry["expected_macs"] == entry["expected_flops"] / 2
        entropy = entry["alpha_entropy"]
        assert len(entropy) == layers
        bounds = [math.log(len(c["options"])) for c in result["space"]["choices"]]
        assert all(0 <= e <= b + 1e-6 for e, b in zip(entropy, bounds, strict=True))


def test_dpfnas_plot_of_a_run_without_noise(tmp_path):
    # modes fnas / single spend epsilon = inf: the plot says so instead of failing

    history = [{"iteration": i, "epsilon": math.inf, "val-accuracy": 0.1 * i} for i in range(3)]
    path = plot_dpfnas(tmp_path / "privacy_accuracy.png", history)
    assert path is not None and path.stat().st_size > 5000


def test_every_accuracy_plot_spans_zero_to_one_with_a_chance_line(tmp_path, monkeypatch):
    """Every accuracy axis shows [0, 1] (noise near chance is no peak) and, given the run's
    chance, a line there; the runs' plots get it (``runs.chance_accuracy``)."""
    import matplotlib.pyplot as plt

    import fedorasflwr.methods.decnas.plots as decnas_plots
    import fedorasflwr.methods.dpfnas.plots as dpfnas_plots
    import fedorasflwr.methods.fdnas.plots as fdnas_plots
    import fedorasflwr.methods.fedoras.plots as fedoras_plots
    import fedorasflwr.plots as shared
    from fedorasflwr.plots import ACCURACY_LIMITS, accuracy_axis

    fig, ax = plt.subplots()
    line = accuracy_axis(ax, 0.1)
    assert ax.get_ylim() == ACCURACY_LIMITS == (0.0, 1.08)
    assert list(line.get_ydata()) == [0.1, 0.1] and line.get_label() == "chance (0.1)"
    assert accuracy_axis(ax, None) is None
    plt.close(fig)

    seen: list[tuple[str, float | None, tuple[float, float]]] = []

    def spy(module):
        def recorded(axis, chance):
            result = accuracy_axis(axis, chance)
            seen.append((module.__name__.split(".")[-2], chance, axis.get_ylim()))
            return result

        monkeypatch.setattr(module, "accuracy_axis", recorded)

    for module in (shared, fedoras_plots, dpfnas_plots, decnas_plots):
        spy(module)  # (fdnas' plots call it as ``plots.accuracy_axis``: the shared spy)
    history = [{"round": r, "iteration": r, "val-accuracy": 0.11 + 0.001 * r} for r in (1, 2)]
    models = tier_models()
    frontier = {"frontier": [{"iteration": 0, "macs": 1000, "test-accuracy": 0.5}]}
    net = {"name": "fdnas", "flops": 3e5, "partitions": [0], "averaged-accuracy": 0.12}
    assert_png(
        shared.plot_history(
            tmp_path / "h.png", history, "val-accuracy", title="t", ylabel="y", chance=0.1
        )
    )
    assert_png(fedoras_plots.plot_tiers(tmp_path / "t.png", models, 0.1))
    assert_png(fedoras_plots.plot_finetune(tmp_path / "f.png", models, 0.1))
    assert_png(fdnas_plots.plot_fdnas_nets(tmp_path / "n.png", [net], chance=0.1))
    assert_png(dpfnas_plots.plot_dpfnas(tmp_path / "d.png", history, chance=0.1))
    assert_png(decnas_plots.plot_frontier(tmp_path / "g.png", frontier, chance=0.1))
    assert [s[0] for s in seen] == [
        "fedorasflwr",
        "fedoras",
        "fedoras",
        "fedorasflwr",  # fdnas' plots call the shared one
        "dpfnas",
        "decnas",
    ]
    assert all(chance == 0.1 and limits == ACCURACY_LIMITS for _, chance, limits in seen)


def test_every_cost_axis_names_its_unit_and_shows_macs_on_top(tmp_path, monkeypatch):
    """The papers' "FLOPs" are MACs: every plot against cost labels its x axis MFLOPs per
    sample (= 2 x MACs) and carries a second axis on top in MMACs, at half the FLOPs."""
    import fedorasflwr.methods.decnas.plots as decnas_plots
    import fedorasflwr.methods.fdnas.plots as fdnas_plots
    import fedorasflwr.methods.fedoras.plots as fedoras_plots
    import fedorasflwr.plots as shared
    from fedorasflwr.plots import FLOPS_LABEL, MACS_LABEL, flops_axis

    assert FLOPS_LABEL == "MFLOPs per sample (= 2 x MACs)"
    assert MACS_LABEL.startswith("MMACs per sample")
    axes: list[tuple[str, Any]] = []

    def spy(module):
        def recorded(ax):
            axes.append((module.__name__.split(".")[-2], ax))
            return flops_axis(ax)

        monkeypatch.setattr(module, "flops_axis", recorded)

    for module in (shared, fedoras_plots, decnas_plots):
        spy(module)  # (fdnas' plots call it as ``plots.flops_axis``: the shared spy)
    net = {"name": "fdnas", "flops": 3e5, "partitions": [0], "averaged-accuracy": 0.7}
    frontier = {"frontier": [{"iteration": 0, "macs": 150_000, "test-accuracy": 0.5}]}
    assert_png(fedoras_plots.plot_tiers(tmp_path / "t.png", tier_models(), 0.1))
    assert_png(fdnas_plots.plot_fdnas_nets(tmp_path / "n.png", [net], chance=0.1))
    assert_png(decnas_plots.plot_frontier(tmp_path / "g.png", frontier, chance=0.1))
    assert [name for name, _ in axes] == ["fedoras", "fedorasflwr", "decnas"]
    for _, ax in axes:
        assert ax.get_xlabel() == FLOPS_LABEL
        (top,) = ax.child_axes
        assert top.get_xlabel() == MACS_LABEL
        low, high = ax.get_xlim()
        assert top.get_xlim() == (low / 2, high / 2)
    # DecNAS's frontier is in MACs: its point sits at 2 x 150K MACs = 0.3 MFLOPs
    (line,) = axes[2][1].get_lines()[:1]
    assert list(line.get_xdata()) == [0.3]


def test_dpfnas_plot_sets_the_derived_nets_accuracy_beside_the_search(tmp_path, monkeypatch):
    # a noised search sits at chance; the derived net's final accuracy is the result
    import fedorasflwr.methods.dpfnas.plots as dpfnas_plots

    captured = {}
    real_finish = dpfnas_plots.finish

    def spy(fig, ax, path, **kwargs):
        captured["ax"] = ax
        return real_finish(fig, ax, path, **kwargs)

    monkeypatch.setattr(dpfnas_plots, "finish", spy)
    history = [
        {"iteration": 1, "epsilon": 4.5},
        {"iteration": 2, "epsilon": 6.5, "val-accuracy": 0.11},
    ]
    path = plot_dpfnas(tmp_path / "privacy_accuracy.png", history, 0.0, 0.1, 0.62)
    assert path is not None
    stars = [line for line in captured["ax"].get_lines() if line.get_marker() == "*"]
    assert len(stars) == 1
    assert list(stars[0].get_xdata()) == [2] and list(stars[0].get_ydata()) == [0.62]


def test_width_baselines_plot_is_an_accuracy_and_cost_plot(tmp_path, monkeypatch):
    # like every accuracy plot here: [0, 1], a chance line, MMACs beside MFLOPs
    import fedorasflwr.plots as shared
    from fedorasflwr.methods.widths.plots import plot_tiers
    from fedorasflwr.plots import ACCURACY_LIMITS, FLOPS_LABEL

    captured = {}
    real_finish = shared.finish

    def spy(fig, ax, path, **kwargs):
        captured["ax"], captured["xlabel"] = ax, kwargs["xlabel"]
        return real_finish(fig, ax, path, **kwargs)

    monkeypatch.setattr(shared, "finish", spy)
    tiers = [
        {"tier": 1, "width": 0.25, "macs": 1_000_000, "test_accuracy": 0.6},
        {"tier": 2, "width": 1.0, "macs": 4_000_000, "test_accuracy": 0.8},
        {"tier": 3, "width": 2.0, "macs": 9_000_000, "test_accuracy": None},  # no client
    ]
    tiers[0]["global_test_accuracy"] = 0.65
    path = plot_tiers(tmp_path / "tiers_accuracy.png", {"mode": "heterofl", "tiers": tiers}, 0.1)
    assert path is not None
    ax = captured["ax"]
    assert ax.get_ylim() == ACCURACY_LIMITS
    assert any(list(line.get_ydata()) == [0.1, 0.1] for line in ax.get_lines())
    assert captured["xlabel"] == FLOPS_LABEL and ax.child_axes  # the MMACs axis on top
    # each tested tier's point is named with its tier and width, above its higher accuracy
    names = {t.get_text(): t.xy for t in ax.texts}
    assert names == {"T1 w=0.25": (2.0, 0.65), "T2 w=1": (8.0, 0.8)}
    assert ax.get_xlim()[0] == 0 and ax.figure._suptitle.get_text().startswith("HeteroFL")


def test_fednas_plots_show_both_cells_entropy_and_the_derived_net(tmp_path, monkeypatch):
    """FedNAS's search plot: one entropy line per architecture variable under the uniform
    level ln 8, the supernet's validation and the derived net's final rounds after the
    search's; its cost plot: the derived net, named, on [0, 1] against MFLOPs."""
    import fedorasflwr.methods.fednas.plots as fednas_plots
    import fedorasflwr.plots as shared

    axes = []
    real_finish = shared.finish

    def spy(fig, ax, path, **kwargs):
        axes.append(fig.axes)
        return real_finish(fig, ax, path, **kwargs)

    monkeypatch.setattr(shared, "finish", spy)
    entropy = {"net.alpha_normal": 2.07, "net.alpha_reduce": 2.0}
    history = [
        {"round": r, "alpha-entropy": {k: v - 0.1 * r for k, v in entropy.items()}}
        for r in (1, 2, 3)
    ]
    history[-1]["val-accuracy"] = 0.3
    final = [{"round": 1, "test-accuracy": 0.5}, {"round": 2, "test-accuracy": 0.7}]
    document = {
        "history": history,
        "final-history": final,
        "flops": 3e5,
        "test-accuracy": 0.7,
        "global-test-accuracy": 0.66,
    }
    search, net = fednas_plots.fednas_plots(tmp_path, document, chance=0.1)
    assert_png(search) and assert_png(net)
    assert (search.name, net.name) == ("search.png", "derived_accuracy_flops.png")
    top, bottom = axes[0][:2]
    labels = [line.get_label() for line in top.get_lines()]
    assert labels == [
        "normal cell (last 1.770)",
        "reduction cell (last 1.700)",
        "undecided (uniform)",
    ]
    assert top.get_lines()[2].get_ydata()[0] == math.log(8)
    derived = next(line for line in bottom.get_lines() if line.get_marker() == "*")
    assert list(derived.get_xdata()) == [4, 5] and list(derived.get_ydata()) == [0.5, 0.7]
    cost = axes[1][0]
    assert {t.get_text() for t in cost.texts} == {"derived net"}
    points = sorted(tuple(line.get_xydata()[0]) for line in cost.get_lines()[:2])
    assert points == [(0.3, 0.66), (0.3, 0.7)]
    assert fednas_plots.plot_fednas_net(tmp_path / "none.png", {"test-accuracy": 0.5}) is None


def test_the_frontier_names_the_rounds_each_gm_trained(tmp_path, monkeypatch):
    """quick-decnas's frontier is not monotone (GM_1 below GM_2 and GM_3 at less cost):
    GM_t starts from GM_t-1, so later GMs have trained more rounds (5, 6, 7, 9 for its
    schedule). Each point says how many, so the plot shows why."""
    import fedorasflwr.methods.decnas.plots as decnas_plots
    from fedorasflwr.config import TrainingRecipe
    from fedorasflwr.methods.decnas.settings import DecNASSettings

    settings = DecNASSettings(  # configs/quick-decnas.toml's schedule
        train=TrainingRecipe(rounds=5, clients_per_round=0),
        rounds=(1, 2),
        rounds_every=2,
        max_iterations=3,
    )
    assert [settings.rounds_trained(t) for t in range(4)] == [5, 6, 7, 9]
    fixed = DecNASSettings(**{**settings.__dict__, "variant": "no-dynamic-rounds"})
    assert [fixed.rounds_trained(t) for t in range(4)] == [5, 7, 9, 11]  # the largest, each
    captured = {}
    real_finish = decnas_plots.finish

    def spy(fig, ax, path, **kwargs):
        captured["ax"], captured["title"] = ax, kwargs["title"]
        return real_finish(fig, ax, path, **kwargs)

    monkeypatch.setattr(decnas_plots, "finish", spy)
    accuracy = [0.82, 0.54, 0.69, 0.69]  # the README's quick-decnas figures
    document = {
        "frontier": [
            {"iteration": t, "macs": 300_000 - 60_000 * t, "test-accuracy": a}
            for t, a in enumerate(accuracy)
        ]
    }
    rounds = {t: settings.rounds_trained(t) for t in range(4)}
    path = plot_frontier(tmp_path / "frontier.png", document, "decnas", 0.1, rounds)
    assert_png(path)
    texts = sorted(t.get_text() for t in captured["ax"].texts)
    assert texts == [f"GM$_{{{t}}}$, {r} rds" for t, r in sorted(rounds.items())]
    assert "rounds GM$_t$ trained" in captured["title"]


def test_cfdnas_plot_sets_the_fdnas_net_on_each_cluster_beside_the_cluster_net(
    tmp_path, monkeypatch
):
    """CFDNAS's point at a glance: for each cluster, the FDNAS net's accuracy on that
    cluster's clients (its per-partition accuracies weighted by test samples; result.json's
    string keys too) as a diamond in the cluster's colour, dotted to the cluster's net."""
    import fedorasflwr.methods.fdnas.plots as fdnas_plots
    import fedorasflwr.plots as shared

    captured = {}
    real_finish = shared.finish

    def spy(fig, ax, path, **kwargs):
        captured["ax"] = ax
        return real_finish(fig, ax, path, **kwargs)

    monkeypatch.setattr(shared, "finish", spy)
    accuracy = {p: 0.5 if p < 2 else 0.8 for p in range(4)}
    count = {0: 10, 1: 30, 2: 20, 3: 20}
    fdnas = {
        "name": "fdnas",
        "flops": 6e5,
        "partitions": [0, 1, 2, 3],
        "averaged-accuracy": 0.65,
        "test-accuracy": {str(p): a for p, a in accuracy.items()},  # as in result.json
        "test-count": {str(p): n for p, n in count.items()},
    }
    clusters = [
        {"name": "cluster-0", "flops": 4e5, "partitions": [0, 1], "averaged-accuracy": 0.7},
        {"name": "cluster-1", "flops": 8e5, "partitions": [2, 3], "averaged-accuracy": 0.75},
    ]
    assert fdnas_plots.cluster_accuracy(fdnas, [0, 1]) == 0.5
    assert fdnas_plots.cluster_accuracy({**fdnas, "test-count": count}, [1, 2]) == 0.62  # ints
    assert fdnas_plots.cluster_accuracy(fdnas, [7]) is None
    assert_png(plot_fdnas_nets(tmp_path / "n.png", [fdnas, *clusters], method="CFDNAS"))
    ax = captured["ax"]
    diamonds = [
        c for c in ax.collections if c.get_paths() and len(c.get_offsets()) == 1
    ]  # scatter points: nets, rings and the diamonds
    at_fdnas = sorted(
        float(c.get_offsets()[0][1])
        for c in diamonds
        if float(c.get_offsets()[0][0]) == 0.6 and c.get_alpha() == 0.55
    )
    assert at_fdnas == [0.5, 0.8]  # on cluster-0's clients, on cluster-1's
    dotted = [line for line in ax.get_lines() if line.get_linestyle() == ":"]
    ends = sorted((tuple(line.get_xdata()), tuple(line.get_ydata())) for line in dotted)
    assert ((0.6, 0.4), (0.5, 0.7)) in ends and ((0.6, 0.8), (0.8, 0.75)) in ends
    # FDNAS alone (no clusters): no diamond
    captured.clear()
    plot_fdnas_nets(tmp_path / "f.png", [fdnas])
    assert not [c for c in captured["ax"].collections if c.get_alpha() == 0.55]
