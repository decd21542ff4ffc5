"""The netadapt example (``examples/netadapt``), shared by its in-process and engine tests:
its run config as Flower hands it over, its package put on ``sys.path``, and the checks on
what its ServerApp writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from fedorasflwr import load_model
from tests.example_apps import EXAMPLES, app_run_config, import_app

EXAMPLE_DIR = EXAMPLES / "netadapt"
MODEL_PATH = "shapesprune.model:ShapesNet"
LAYERS = ["features.0", "features.3", "features.7", "classifier.0"]


def run_config(**overrides: Any) -> dict[str, Any]:
    """The example's ``[tool.flwr.app.config]``, flattened as Flower does, then overrides."""
    return app_run_config(EXAMPLE_DIR, **overrides)


def import_example() -> None:
    """Make ``shapesprune`` importable here as Flower makes it in its apps."""
    import_app(EXAMPLE_DIR)


def check_result(out: Path, config: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """Check ``out/result.json`` and ``out/model.pt`` against the example's model; return the
    summary and ``model.pt``'s accuracy on images of a node that took no part (a fresh
    partition id).

    The frontier runs GM_0 .. GM_T with MACs falling and at most ``decnas.target`` of GM_0's
    at the end; ``model.pt`` rebuilds (``load_model``) as the pruned ``ShapesNet`` of
    GM_T's widths and MACs, holding the tuned weights.
    """
    import_example()
    from shapesprune.data import NUM_CLASSES, partition
    from shapesprune.model import ShapesNet

    found = json.loads((out / "result.json").read_text())
    assert found["model"]["name"] == MODEL_PATH  # rebuilt by the clients from its import path
    assert found["model"]["layers"] == LAYERS
    frontier, final = found["frontier"], found["final"]
    assert [gm["gm"] for gm in frontier] == list(range(len(frontier))) and len(frontier) >= 2
    macs = [gm["macs"] for gm in frontier]
    assert macs == sorted(macs, reverse=True) and len(set(macs)) == len(macs), macs
    assert frontier[0]["widths"] == [config["width"], 2 * config["width"], 2 * config["width"]] + [
        config["hidden"]
    ]
    for gm in frontier:
        assert 0.0 <= gm["test-accuracy"] <= 1.0, gm
    assert final["gm"] == frontier[-1]["gm"] and final["widths"] == frontier[-1]["widths"]
    assert final["macs"] == macs[-1] and final["macs-fraction"] == macs[-1] / macs[0]
    assert final["macs"] <= config["decnas.target"] * macs[0], final
    assert final["tuned"] and final["test-accuracy"] == frontier[-1]["tuned-test-accuracy"]

    ckpt = torch.load(out / final["file"], weights_only=True)
    assert ckpt["builder"] == "prunable" and ckpt["stage"] == "final"  # save_model's
    net = load_model(out / final["file"])
    assert isinstance(net.model, ShapesNet)
    assert list(net.widths) == final["widths"] and net.cost().flops // 2 == final["macs"]
    fresh, _, _ = partition(int(config["seed"]), 1000, 200, float(config["noise"]))
    images, labels = fresh.tensors
    with torch.no_grad():
        logits = net.eval()(images)
    assert logits.shape == (len(images), NUM_CLASSES)
    return found, (logits.argmax(1) == labels).float().mean().item()
