"""A quick preset run whole under variants of its run config, side by side: what each final
model scored, per variant and seed.

Issue 40's check of a space change before it becomes a default: ``configs/quick-cfdnas.toml``
(class-group clients, search lr 0.1) with the ``mbconv`` space's GAP head (the paper's), the
flatten head, and each with and without every weight step's gradient clipped at L2 norm 5
(``fdnas.grad-clip``; DARTS's value, which the ``darts`` space's flatten head needed). The
flatten head with the clip became FDNAS's default after this check (each variant sets both
keys it compares, so the recorded rows hold whatever the defaults are).

    python benchmarks/preset_variants.py                     # quick-cfdnas, 4 variants, seeds 0 1
    python benchmarks/preset_variants.py --preset quick-fdnas --seeds 0 1 2
    python benchmarks/preset_variants.py --quick             # CI smoke run

Results: ``results/preset_variants.json`` for the default preset, else
``results/preset_variants.<preset>.json``.

Each run is the preset over the ``pyproject.toml`` defaults plus the variant's keys and
``seed``, on the in-process grid with the real ClientApp and 20 nodes (what
``tests/presets`` runs; the launcher's simulation engine computes with other thread counts,
so its figures can differ by a few points); the rows are each final model's accuracy on its
clients' test splits (``averaged_accuracy`` where the method reports nets, else
``test_accuracy``) and on the global test set, read back from the run's ``result.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

from common import ROOT, report, run_config

NODES = 20  # the launcher's --num-supernodes default, the presets' clients

#: name -> run-config keys over the preset; the default comparison (module docstring)
VARIANTS: dict[str, dict[str, Any]] = {
    "gap": {"space.head": "gap", "fdnas.grad-clip": 0.0},
    "flatten": {"space.head": "flatten", "fdnas.grad-clip": 0.0},
    "flatten-clip-5": {"space.head": "flatten", "fdnas.grad-clip": 5.0},
    "gap-clip-5": {"space.head": "gap", "fdnas.grad-clip": 5.0},
}


def preset_config(preset: str, keys: dict[str, Any], seed: int, quick: bool) -> dict[str, Any]:
    """``configs/<preset>.toml`` over the defaults, then ``keys`` and ``seed``; ``quick``:
    every stage of an FDNAS preset cut to one round."""
    from flwr.common.config import flatten_dict

    toml = flatten_dict(tomllib.loads((ROOT / "configs" / f"{preset}.toml").read_text()))
    config = run_config({**toml, **keys, "seed": seed})
    if quick:
        config |= {"fdnas.rounds": 1, "fdnas.cluster-rounds": 1, "fdnas.final-rounds": 1}
    return config


def models(document: dict[str, Any]) -> list[dict[str, Any]]:
    """Each final model of a ``result.json``: name, clients' and global test accuracy."""
    if document.get("nets"):
        return [
            {
                "model": net["name"],
                "test": net.get("averaged_accuracy"),
                "global": net.get("global_test_accuracy"),
            }
            for net in document["nets"]
        ]
    return [
        {
            "model": document["method"],
            "test": document.get("test_accuracy"),
            "global": document.get("global_test_accuracy"),
        }
    ]


def run(config: dict[str, Any]) -> dict[str, Any]:
    """One whole run on the in-process grid; its ``result.json``."""
    from flwr.app import Context, RecordDict

    from fedorasflwr.client_app import app as client_app
    from fedorasflwr.inprocess import InProcessGrid
    from fedorasflwr.server_app import main

    with tempfile.TemporaryDirectory() as out:
        config = {**config, "output-dir": out}
        context = Context(
            run_id=7, node_id=0, node_config={}, state=RecordDict(), run_config=config
        )
        main(InProcessGrid(client_app, config, NODES), context)
        (run_dir,) = Path(out).iterdir()
        document = json.loads((run_dir / "result.json").read_text())
    if not document["status"]["finished"]:
        raise RuntimeError(f"the run did not finish: {document['status']}")
    return document


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="quick-cfdnas", help="configs/<preset>.toml")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--quick", action="store_true", help="CI smoke run")
    args = parser.parse_args(argv)
    variants = args.variants[:2] if args.quick else args.variants
    seeds = args.seeds[:1] if args.quick else args.seeds

    rows = []
    for seed in seeds:
        for variant in variants:
            start = time.perf_counter()
            document = run(preset_config(args.preset, VARIANTS[variant], seed, args.quick))
            seconds = round(time.perf_counter() - start, 1)
            for model in models(document):
                rows.append({"variant": variant, "seed": seed, **model, "seconds": seconds})
                print(
                    f"{variant}, seed {seed}: {model['model']} test {model['test']:.3f}, "
                    f"global {model['global']:.3f}, {seconds} s",
                    flush=True,
                )
    summary: dict[str, Any] = {"runs": len(seeds) * len(variants)}
    for variant in variants:
        mine = [r for r in rows if r["variant"] == variant]
        # the first model each run reports: FDNAS's global net (CFDNAS: then its clusters')
        first = [r["test"] for r in mine if r["model"] == mine[0]["model"]]
        summary[f"{variant}_first_test_mean"] = statistics.mean(first)
        summary[f"{variant}_test_mean"] = statistics.mean(r["test"] for r in mine)
    default = parser.get_default("preset")
    report(
        "preset_variants" + ("" if args.preset == default else f".{args.preset}"),
        args.quick,
        summary,
        {"preset": args.preset, "variants": {v: VARIANTS[v] for v in variants}, "rows": rows},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
