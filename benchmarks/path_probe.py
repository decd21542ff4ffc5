"""The server's lr probe on sampled ``cnn_s`` paths, per reduction (issue 40).

FedorAS's Stage 1 trains random ``cnn_s`` paths at lr 0.1 (momentum 0.9, batch 16 in the
quick preset). With the paper's reduction (conv1x1, then average pooling) its quick preset
trains; with max pooling first (``space.reduction = "maxpool-conv1x1"``) its tiers lost
6-14 pp on MNIST-5k and got them back at lr 0.05 (benchmarks/README.md, "The reduction").
This asks `fedorasflwr.training.probe_lr`, the width baselines' rule, what it would keep for
seeded random paths of each reduction: 48 SGD steps per rate from the path's init on the
server's slice, the largest of lr and its halvings whose losses stay within 2 x ln(classes).
A last row per dataset and reduction (``path`` "sampled") is what FedorAS's Stage-1 probe
(``fedoras.lr-probe``, ``methods.fedoras.runner.probed_supernet_recipe``) keeps for the
quick preset's supernet: a fresh random path per step, as Stage 1 trains it.

    python benchmarks/path_probe.py            # MNIST-5k and shapes, both reductions, 4 paths
    python benchmarks/path_probe.py --quick    # smoke: MNIST-5k, 1 path

The headline: per dataset and reduction, how many paths keep the configured rate and the
smallest rate kept. Writes ``benchmarks/results/path_probe.json`` (``.quick.json``).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from common import ROOT, dataset_label, report
from lr_stability import shapes_folder

sys.path.insert(0, str(ROOT))

RECIPE = {"lr": 0.1, "momentum": 0.9, "batch-size": 16, "weight-decay": 0.0}  # quick-fedoras


def probe_paths(dataset: str, reduction: str, paths: int) -> list[dict[str, Any]]:
    """``paths`` seeded random paths of ``cnn_s`` (width 0.5, ``reduction``) on ``dataset``:
    each one's architecture, MACs and what the probe tried and kept."""
    import numpy as np
    import torch
    from common import run_config

    from fedorasflwr.config import parse_run_config
    from fedorasflwr.data import load_server_data
    from fedorasflwr.methods.widths.runner import image_spec
    from fedorasflwr.search_spaces import build_space
    from fedorasflwr.seeding import seed_torch
    from fedorasflwr.training import probe_lr

    torch.set_num_threads(1)
    settings = parse_run_config(run_config({"data.dataset": dataset, "seed": 0}))
    server, image = load_server_data(settings.data), image_spec(settings)
    seed_torch(0, "path-probe-init")
    space = build_space("cnn_s", **image, width=0.5, reduction=reduction)
    rng = np.random.default_rng(1)
    rows = []
    for index in range(paths):
        arch = tuple(int(rng.integers(len(c.options))) for c in space.choices)
        started = time.monotonic()
        probe = probe_lr(
            lambda arch=arch: space.subnet(arch),
            server,
            RECIPE,
            [0, index],
            num_classes=image["num_classes"],
        )
        rows.append(
            {
                "dataset": dataset_label(dataset),
                "reduction": reduction,
                "path": index,
                "ops": [c.options[i] for c, i in zip(space.choices, arch, strict=True)],
                "macs": int(space.cost(arch).flops // 2),
                "configured": probe.configured,
                "kept": probe.lr,
                "bound": probe.bound,
                "tried": [[lr, loss] for lr, loss in probe.tried],
                "server_slice": len(server),
                "seconds": round(time.monotonic() - started, 1),
            }
        )
    return rows


def probe_supernet(dataset: str, reduction: str) -> dict[str, Any]:
    """What FedorAS's Stage-1 probe keeps for the quick preset's supernet on ``dataset``
    with ``reduction`` (the product's function, seed 0)."""
    import torch
    from common import run_config

    from fedorasflwr.config import parse_run_config
    from fedorasflwr.data import load_server_data
    from fedorasflwr.launch.cli import read_run_config
    from fedorasflwr.methods.fedoras.runner import probed_supernet_recipe
    from fedorasflwr.runs import build_supernet

    torch.set_num_threads(1)
    overrides = {"data.dataset": dataset, "space.reduction": reduction, "seed": 0}
    preset = read_run_config([str(ROOT / "configs" / "quick-fedoras.toml")])
    settings = parse_run_config(run_config({**preset, **overrides}))
    server = load_server_data(settings.data)
    started = time.monotonic()
    probed, probe = probed_supernet_recipe(settings, build_supernet(settings), server)
    assert probe is not None and probed.method_settings.train.lr == probe.lr
    return {
        "dataset": dataset_label(dataset),
        "reduction": reduction,
        "path": "sampled",
        "ops": [],
        "macs": None,
        "configured": probe.configured,
        "kept": probe.lr,
        "bound": probe.bound,
        "tried": [[lr, loss] for lr, loss in probe.tried],
        "server_slice": len(server),
        "seconds": round(time.monotonic() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    from fedorasflwr.search_spaces.cnn import REDUCTIONS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--paths", type=int, default=4)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    datasets = ["mnist5k"] if args.quick else ["mnist5k", shapes_folder()]
    paths = 1 if args.quick else args.paths
    rows = [
        row
        for dataset in datasets
        for reduction in REDUCTIONS
        for row in [*probe_paths(dataset, reduction, paths), probe_supernet(dataset, reduction)]
    ]
    summary: dict[str, Any] = {"paths": paths, "configured_lr": RECIPE["lr"]}
    kept: dict[str, list[float]] = {}
    for row in rows:
        if row["path"] == "sampled":
            summary[f"{row['dataset']}_{row['reduction']}_stage1_kept"] = row["kept"]
            continue
        kept.setdefault(f"{row['dataset']}_{row['reduction']}", []).append(row["kept"])
    for key, rates in kept.items():
        summary[f"{key}_kept_configured"] = sum(lr == RECIPE["lr"] for lr in rates)
        summary[f"{key}_smallest_kept"] = min(rates)
    for row in rows:
        losses = ", ".join(f"{lr:g}: {loss:.2f}" for lr, loss in row["tried"])
        print(
            f"{row['dataset']:<18} {row['reduction']:<16} path {row['path']}: kept "
            f"{row['kept']:g} (bound {row['bound']:.2f}; {losses}) "
            f"{'-'.join(row['ops']) or 'a random path per step (Stage 1)'}"
        )
    report("path_probe", args.quick, summary, {"recipe": RECIPE, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
