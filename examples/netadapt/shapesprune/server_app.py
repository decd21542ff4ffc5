"""The ServerApp: DecNAS prunes the example's own model, then what it found, printed and
saved.

``search(grid, run_config)`` is the whole run on any Flower ``Grid`` (the engine's, or
``fedorasflwr.inprocess.InProcessGrid`` in a test); ``main`` runs it under Flower and writes
``<output-dir>/result.json`` (the frontier and the final model) and ``model.pt`` (the final
model's weights, FedAvg-tuned).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from fedorasflwr import save_model
from fedorasflwr.search_spaces import PrunableNet, build_prunable, load_prunable
from fedorasflwr.strategies import DecNAS, DecNASResult, DecNASSettings
from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp

from shapesprune.data import CLASSES, INPUT_SHAPE, NUM_CLASSES
from shapesprune.model import ShapesNet

MODEL_FILE = "model.pt"


def search(grid: Grid, run_config: Mapping[str, Any]) -> tuple[PrunableNet, DecNASResult]:
    """Wrap ``ShapesNet`` for DecNAS and run it on ``grid``: GM_0's FedAvg rounds, the
    NetAdapt iterations down to ``decnas.target`` of GM_0's MACs, then GM_T's tuning."""
    seed = int(run_config["seed"])
    torch.manual_seed(seed)  # GM_0's initial weights
    net = build_prunable(
        ShapesNet,
        input_shape=INPUT_SHAPE,
        num_classes=NUM_CLASSES,
        width=int(run_config["width"]),
        hidden=int(run_config["hidden"]),
    )
    strategy = DecNAS(
        net=net,
        settings=DecNASSettings.from_config(run_config),  # the decnas.* keys
        seed=seed,
        min_nodes=int(run_config["min-nodes"]),
    )
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(net.state_dict()),
        num_rounds=int(run_config["num-server-rounds"]),  # the most NetAdapt iterations
        timeout=float(run_config["reply-timeout"]),
    )
    return net, result


def final_model(result: DecNASResult) -> tuple[ArrayRecord, float | None]:
    """GM_T's weights to deploy and their test accuracy: ``result.arrays`` is GM_T after
    the FedAvg tuning when it ran (``decnas.final-rounds`` > 0 and T > 0), else as the
    search left it (``result.untuned_arrays``: always as the search left it)."""
    last = result.frontier[-1]
    tuned = last.tuned_arrays is not None
    return result.arrays, last.tuned_test_accuracy if tuned else last.test_accuracy


def summary(net: PrunableNet, result: DecNASResult) -> dict[str, Any]:
    """What the run found, as JSON: the model, the frontier GM_0 .. GM_T (each one's
    widths, MACs and accuracies) and the final model (GM_T, tuned)."""
    gm0, last = result.frontier[0], result.frontier[-1]
    _, accuracy = final_model(result)
    return {
        "model": {
            "name": net.spec["name"],
            "classes": list(CLASSES),
            "layers": list(net.layer_names()),
        },
        "frontier": [
            {
                "gm": m.iteration,
                "widths": m.widths,
                "macs": m.macs,
                "params": m.params,
                "val-accuracy": m.summary()["search-val-accuracy"],
                "test-accuracy": m.test_accuracy,
                "tuned-test-accuracy": m.tuned_test_accuracy,
            }
            for m in result.frontier
        ],
        "final": {
            "gm": last.iteration,
            "widths": last.widths,
            "macs": last.macs,
            "params": last.params,
            "macs-fraction": last.macs / gm0.macs,
            "test-accuracy": accuracy,
            "tuned": last.tuned_arrays is not None,
            "file": MODEL_FILE,
        },
    }


def save(net: PrunableNet, result: DecNASResult, out: Path) -> dict[str, Any]:
    """Write ``result.json`` and the final model (``model.pt``) to ``out``; return the summary.

    ``model.pt`` is read back with ``fedorasflwr.load_model(path)``: the pruned net
    (``PrunableNet``; its ``.model`` is the pruned ``ShapesNet`` itself; ``shapesprune`` is
    imported when importable); ``fedorasflwr.save_model`` writes it.
    """
    out.mkdir(parents=True, exist_ok=True)
    found = summary(net, result)
    (out / "result.json").write_text(json.dumps(found, indent=2))
    arrays, _ = final_model(result)
    stage = "final" if found["final"]["tuned"] else "iterations"
    final = load_prunable(result.frontier[-1].spec, arrays.to_torch_state_dict())
    save_model(out / MODEL_FILE, final, stage=stage)
    return found


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    net, result = search(grid, context.run_config)
    out = Path(str(context.run_config["output-dir"])).absolute()
    print(report(save(net, result, out), out))


def report(found: dict[str, Any], out: Path) -> str:
    """What ``main`` prints: the model, one line per GM_t, the final model."""
    lines = [f"shapesprune: {found['model']['name']}, prunable layers {found['model']['layers']}"]
    for gm in found["frontier"]:
        tuned = gm["tuned-test-accuracy"]
        lines.append(
            f"  GM_{gm['gm']}: widths {gm['widths']}, {gm['macs']} MACs, test accuracy "
            f"{gm['test-accuracy']:.3f}" + ("" if tuned is None else f", {tuned:.3f} tuned")
        )
    final = found["final"]
    lines.append(
        f"shapesprune: final model GM_{final['gm']}, {final['macs-fraction']:.2f} of GM_0's "
        f"MACs, test accuracy {final['test-accuracy']:.3f}; wrote {out / 'result.json'}"
    )
    return "\n".join(lines)
