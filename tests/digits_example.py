"""The digits example (``examples/digits``), shared by its in-process and engine tests:
its run config as Flower hands it over, its package put on ``sys.path``, and the checks on
what its ServerApp writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from fedorasflwr import load_model
from fedorasflwr.search_spaces import build_space
from tests.example_apps import EXAMPLES, app_run_config, import_app

EXAMPLE_DIR = EXAMPLES / "digits"
SPACE_PATH = "digitsnas.space:DigitsSpace"


def run_config(**overrides: Any) -> dict[str, Any]:
    """The example's ``[tool.flwr.app.config]``, flattened as Flower does, then overrides."""
    return app_run_config(EXAMPLE_DIR, **overrides)


def import_example() -> None:
    """Make ``digitsnas`` importable here as Flower makes it in its apps: the app's
    directory on ``sys.path`` (it is not installed)."""
    import_app(EXAMPLE_DIR)


def check_result(out: Path, config: dict[str, Any]) -> dict[str, Any]:
    """Check ``out/result.json`` and the model files against the example's space; return it.

    Every tier has one model, of an architecture of the example's space (indices and option
    names agree, the FLOPs are the space's and within the tier's range), with a test
    accuracy in [0, 1]; each ``tier-<k>.pt`` rebuilds and classifies a batch of digits.
    """
    import_example()
    from digitsnas.data import server_slice

    found = json.loads((out / "result.json").read_text())
    assert found["space"]["name"] == SPACE_PATH  # unregistered: rebuilt from its import path
    space = build_space(**found["space"])
    assert found["choices"] == {c.name: list(c.options) for c in space.choices}
    num_tiers = int(config["fedoras.num-tiers"])
    assert [t["tier"] for t in found["tiers"]] == list(range(1, num_tiers + 1))
    assert len(found["supernet-rounds"]) == int(config["num-server-rounds"])
    models = [m for m in found["models"] if m["init"] == "supernet"]
    assert sorted(m["tier"] for m in models) == list(range(1, num_tiers + 1)), found["models"]
    images = server_slice(int(config["seed"]), float(config["server-fraction"])).tensors[0][:16]
    for model in models:
        arch = space.validate_arch(model["arch"])
        assert space.option_names(arch) == model["names"]
        cost = space.cost(arch)
        assert (model["flops"], model["params"]) == (cost.flops, cost.params)
        tier = found["tiers"][model["tier"] - 1]
        assert tier["flops-low"] <= model["flops"] <= tier["flops-high"], (model, tier)
        assert model["macs"] * 2 == model["flops"]  # MACs beside FLOPs: the papers' unit
        assert (tier["macs-low"], tier["macs-high"]) == (
            tier["flops-low"] / 2,
            tier["flops-high"] / 2,
        )
        for key in ("test-accuracy", "search-accuracy"):
            assert isinstance(model[key], float) and 0.0 <= model[key] <= 1.0, model
        assert model["test-examples"] > 0 and model["test-clients"] > 0
        ckpt = torch.load(out / f"tier-{model['tier']}.pt", weights_only=True)
        assert ckpt["arch"] == model["arch"] and ckpt["builder"] == "subnet"  # save_model's
        net = load_model(out / f"tier-{model['tier']}.pt")
        assert list(net.arch) == model["arch"]
        with torch.no_grad():
            assert net(images).shape == (len(images), 10)
    return found
