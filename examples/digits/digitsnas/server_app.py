"""The ServerApp: FedorAS on the example's own space, then what it found, printed and saved.

``search(grid, run_config)`` is the whole run on any Flower ``Grid`` (the engine's, or
``fedorasflwr.inprocess.InProcessGrid`` in a test); ``main`` runs it under Flower and writes
``<output-dir>/result.json`` and one ``tier-<k>.pt`` per tier.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from fedorasflwr import save_model
from fedorasflwr.strategies import FedorAS, FedorASResult, FedorASSettings
from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp

from digitsnas.data import NUM_CLASSES, server_slice
from digitsnas.space import DigitsSpace


def search(grid: Grid, run_config: Mapping[str, Any]) -> tuple[DigitsSpace, FedorASResult]:
    """Build the space and FedorAS from the run config and run all three stages on ``grid``."""
    seed = int(run_config["seed"])
    torch.manual_seed(seed)  # the supernet's initial weights
    space = DigitsSpace(num_classes=NUM_CLASSES, width=int(run_config["width"]))
    strategy = FedorAS(
        space=space,
        settings=FedorASSettings.from_config(run_config),  # the fedoras.* keys
        seed=seed,
        server_data=server_slice(seed, float(run_config["server-fraction"])),
        min_nodes=int(run_config["min-nodes"]),
    )
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(space.state_dict()),
        num_rounds=int(run_config["num-server-rounds"]),
        timeout=float(run_config["reply-timeout"]),
    )
    return space, result


def summary(space: DigitsSpace, result: FedorASResult) -> dict[str, Any]:
    """What the run found, as JSON: the space, the tiers and each tier's model (1 = lowest).
    Costs in FLOPs (``torch.utils.flop_counter``: 2 x MACs) and in MACs, the papers' "FLOPs"."""
    return {
        "space": dict(space.spec),
        "choices": {layer.name: list(layer.options) for layer in space.choices},
        "tiers": [
            {
                "tier": t.index + 1,
                "flops-low": t.low,
                "flops-high": t.high,
                "macs-low": t.low / 2,
                "macs-high": t.high / 2,
            }
            for t in result.tiers
        ],
        "supernet-rounds": [
            {"round": r["round"], "train-loss": r["train-loss"], "clients": r["clients"]}
            for r in result.history
            if "train-loss" in r
        ],
        "models": [
            {
                "tier": m.tier + 1,
                "init": m.init,
                "arch": list(m.arch),
                "names": list(m.names),
                "flops": m.flops,
                "macs": m.macs,
                "params": m.params,
                "search-accuracy": m.search_accuracy,
                "test-accuracy": m.test.accuracy,
                "test-examples": m.test.examples,
                "test-clients": m.test.clients,
            }
            for m in result.models
        ],
    }


def save(space: DigitsSpace, result: FedorASResult, out: Path) -> dict[str, Any]:
    """Write ``result.json`` and each tier's fine-tuned model to ``out``; return the summary.

    A model file is read back with ``fedorasflwr.load_model(path)`` (the tier's subnet,
    its weights loaded; ``digitsnas`` is imported when importable); ``fedorasflwr.save_model``
    writes it.
    """
    out.mkdir(parents=True, exist_ok=True)
    found = summary(space, result)
    (out / "result.json").write_text(json.dumps(found, indent=2))
    for m in result.models:
        suffix = "" if m.init == "supernet" else f"-{m.init}"
        net = space.subnet(m.arch)
        net.load_state_dict(m.arrays.to_torch_state_dict())
        save_model(out / f"tier-{m.tier + 1}{suffix}.pt", net)
    return found


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    space, result = search(grid, context.run_config)
    out = Path(str(context.run_config["output-dir"])).absolute()
    found = save(space, result, out)
    print(f"digitsnas: search space {space.spec['name']}, {len(found['tiers'])} tier(s)")
    for model in found["models"]:
        print(
            f"  tier {model['tier']} ({model['init']}): {'-'.join(model['names'])}, "
            f"{model['flops']} FLOPs ({model['macs']} MACs), {model['params']} params, "
            f"test accuracy {model['test-accuracy']:.3f} on {model['test-clients']} client(s)"
        )
    print(f"digitsnas: wrote {out / 'result.json'}")
