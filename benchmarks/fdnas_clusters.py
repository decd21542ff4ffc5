"""FDNAS vs a fixed net, CFDNAS vs FDNAS and naive-CFDNAS, on the paper's class-group split.

MNIST-5k, 10 clients: classes 0-2 on clients 0-2, 3-5 on 3-5, 6-9 on 6-9 (the
FDNAS paper's layout; each client's own data split 90/10 train/validation plus
a test slice).  One run, same seed, side by side (in-process grid: the real
ClientApp, no engine):

- **FDNAS** (search on all clients with the fixed net's FLOPs as its hardware target,
  derive the most probable net within the fixed net's FLOPs, ``fdnas.max-flops``) vs a
  **fixed MobileNetV2-like net** (every layer MBConv k3 e6) under the same FedAvg (30
  rounds, every net starting from the supernet's weights; ``--final-init scratch`` for
  the paper's from-scratch training);
- **CFDNAS**: each cluster (class group) inherits w and alpha and searches on
  with a lower FLOPs target; its net is FedAvg-trained on the cluster's clients
  and compared with the FDNAS net on the same clients, and with
  **naive-CFDNAS** (fresh supernet, same cluster rounds);
- **centralised DNAS**: one party holding all the data runs the same search
  (IID, one client), its net trained centrally and tested on its own test slice;
- the **compute** (training FLOPs, forward x3) of each cluster's search relative
  to the FDNAS search (paper: 3.5 / 59 GPU hours, about 6% per cluster).

Accuracy: "averaged" = the global model on the pooled test data of the clients
concerned (paper's double dagger); "local" = mean over those clients of the test
accuracy after their local epochs in the last FedAvg round (paper's dagger).
FLOPs = 2 x MACs per sample (``torch.utils.flop_counter``).

    python benchmarks/fdnas_clusters.py            # full run (numbers: benchmarks/README.md)
    python benchmarks/fdnas_clusters.py --quick    # CI smoke run (< 2 minutes)
    python benchmarks/fdnas_clusters.py --head gap --grad-clip 0   # the paper's head, no clip
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from common import ROOT, report, run_config

sys.path.insert(0, str(ROOT))

from fedorasflwr.search_spaces.cnn import HEADS  # noqa: E402

NUM_CLIENTS = 10


# The FLOPs knobs are fractions of the supernet's largest path, or "fixed": the fixed net's.
DEFAULTS: dict[str, Any] = {
    "target_flops": "fixed",  # the search aims at the fixed net's FLOPs ...
    "max_flops": "fixed",  # ... and no derived net may exceed them
    "cluster_target_flops": 0.3,
    "final_init": "supernet",
    "final_rounds": 30,
    # ProxylessNAS warms the weights up for 40 epochs before 120 of search: a quarter of
    # the search; here 2 of the 10 search rounds (alpha frozen), then 8 of alpha steps
    "warmup_rounds": 2,
    # the space's head (space.head): auto = flatten for mbconv since issue 40's switch (with
    # fdnas.grad-clip 5, the run config's default); "gap" is the paper's
    "head": "auto",
    # every weight step's gradient clipped at this L2 norm (fdnas.grad-clip); None: the run
    # config's (5 since issue 40's switch; 0 before it, the figures of the .grad-clip-0.0 files)
    "grad_clip": None,
}


def settings(quick: bool, cache_dir: Path, knobs: dict[str, Any]) -> dict[str, Any]:
    """The run config of every row; ``knobs`` as in ``DEFAULTS``, FLOPs shares numeric."""
    return {
        "method": "cfdnas",
        "data.cache-dir": str(cache_dir),
        "data.partitioner": "class-groups",
        "data.val-fraction": 0.09,  # train : val = 0.81 : 0.09 = 90 : 10 (paper)
        "data.test-fraction": 0.1,
        "space.head": knobs["head"],
        "space.width": 0.25 if quick else 0.5,
        "space.layers-per-block": 1 if quick else 2,
        "fdnas.rounds": 1 if quick else 10,
        "fdnas.warmup-rounds": 0 if quick else knobs["warmup_rounds"],
        "fdnas.cluster-rounds": 1 if quick else 2,
        "fdnas.local-epochs": 1,
        "fdnas.batch-size": 128 if quick else 32,
        # ten rounds at ProxylessNAS's 6e-3 leave alpha nearly flat, so the argmax
        # net sits on the cheapest options whatever the target; the same for every row
        "fdnas.alpha-lr": 0.03,
        "fdnas.target-flops": knobs["target_flops"],
        "fdnas.max-flops": knobs["max_flops"],
        "fdnas.cluster-target-flops": str(knobs["cluster_target_flops"]),
        "fdnas.final-rounds": 1 if quick else knobs["final_rounds"],
        "fdnas.final-local-epochs": 1,
        "fdnas.final-init": knobs["final_init"],  # every net of the table starts the same way
        **({} if knobs["grad_clip"] is None else {"fdnas.grad-clip": knobs["grad_clip"]}),
    }


def fixed_arch(space: Any) -> tuple[int, ...]:
    """The fixed MobileNetV2-like net: MBConv k3 e6 in every layer."""
    return tuple(choice.options.index("mbconv_k3_e6") for choice in space.choices)


def resolve(knobs: dict[str, Any], quick: bool, cache_dir: Path) -> dict[str, Any]:
    """``knobs`` with "fixed" replaced by the fixed net's share of the largest path."""
    from fedorasflwr.strategies import FDNAS

    numeric = {k: 1.0 if v == "fixed" else v for k, v in knobs.items()}
    space = make(FDNAS, run_config(settings(quick, cache_dir, numeric))).space
    fixed = space.cost(fixed_arch(space)).flops / space.max_flops()
    return {k: fixed if v == "fixed" else v for k, v in knobs.items()}


def share(text: str) -> float | str:
    """A FLOPs knob on the command line: a fraction in (0, 1], or "fixed"."""
    if text == "fixed":
        return text
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a fraction in (0, 1], or 'fixed'")
    return value


def make(cls: type, config: dict[str, Any], **kwargs: Any) -> Any:
    import torch

    from fedorasflwr.config import parse_run_config, space_kwargs
    from fedorasflwr.data import dataset_info
    from fedorasflwr.methods.fdnas.runner import cluster_tagger
    from fedorasflwr.search_spaces import build_space

    run = parse_run_config(config)
    torch.manual_seed(run.seed)
    space = build_space(**space_kwargs(replace(run.space, name="mbconv"), dataset_info(run.data)))
    fdnas = kwargs.pop("fdnas", run.method_settings)
    return cls(space=space, settings=fdnas, seed=run.seed, cluster_of=cluster_tagger(run), **kwargs)


def search_flops(ledger: dict[str, Any], stage: str) -> int:
    return int(ledger.get(stage, {}).get("totals", {}).get("train_flops", 0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke run")
    parser.add_argument("--target-flops", type=share, default=DEFAULTS["target_flops"])
    parser.add_argument("--max-flops", type=share, default=DEFAULTS["max_flops"])
    parser.add_argument(
        "--cluster-target-flops", type=share, default=DEFAULTS["cluster_target_flops"]
    )
    parser.add_argument(
        "--final-init",
        choices=("scratch", "supernet"),
        default=DEFAULTS["final_init"],
        help="the final FedAvg of every net starts from scratch or from the supernet's weights",
    )
    parser.add_argument("--final-rounds", type=int, default=DEFAULTS["final_rounds"])
    parser.add_argument(
        "--warmup-rounds",
        type=int,
        default=DEFAULTS["warmup_rounds"],
        help="first search rounds train the weights only (fdnas.warmup-rounds; 0: none)",
    )
    parser.add_argument(
        "--head",
        choices=("auto", *HEADS),
        default=DEFAULTS["head"],
        help="the space's classifier head (space.head; auto: flatten)",
    )
    parser.add_argument(
        "--grad-clip",
        type=float,
        default=DEFAULTS["grad_clip"],
        help="max L2 norm of each weight step's gradient (fdnas.grad-clip; default: the run "
        "config's; 0: none)",
    )
    args = parser.parse_args(argv)
    knobs = {k: getattr(args, k) for k in DEFAULTS}
    import torch

    torch.set_num_threads(1)
    from flwr.app import ArrayRecord

    from fedorasflwr.client_app import app
    from fedorasflwr.inprocess import InProcessGrid
    from fedorasflwr.strategies import CFDNAS, FDNAS

    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        resolved = resolve(knobs, args.quick, cache)
        config = run_config(settings(args.quick, cache, resolved))

        def grid(num: int = NUM_CLIENTS, cfg: dict[str, Any] = config) -> InProcessGrid:
            return InProcessGrid(app, cfg, num)

        cfdnas = make(CFDNAS, config)
        result = cfdnas.start(grid(), ArrayRecord(), cfdnas.settings.train.rounds)
        fdnas_net, cluster_nets = result.nets[0], result.nets[1:]
        naive = make(CFDNAS, config, inherit=False, train_global=False)
        naive_nets = naive.start(grid(), ArrayRecord(), naive.settings.train.rounds).nets

        fixed = make(FDNAS, config)
        fixed.setup(g := grid())
        fixed_net = fixed.train_net(
            g,
            name="mobilenetv2-like",
            arch=fixed_arch(fixed.space),
            supernet=result.supernet,
            partitions=list(range(NUM_CLIENTS)),
        )

        central_config = {**config, "data.partitioner": "iid"}
        central = make(
            FDNAS,
            central_config,
            fdnas=replace(
                cfdnas.settings,
                train=replace(cfdnas.settings.train, clients_per_round=1),
                min_replies=1,
            ),
            min_nodes=1,
        )
        central_result = central.start(
            grid(1, central_config), ArrayRecord(), central.settings.train.rounds
        )
        central_net = central_result.nets[0]

    search = search_flops(result.ledger, "search")
    rows: list[dict[str, Any]] = []

    def row(name: str, net: Any, partitions: list[int], ledger: dict | None = None) -> None:
        rows.append(
            {
                "net": name,
                "clients": f"{partitions[0]}-{partitions[-1]}",
                "options": net.option_names,
                "flops": net.flops,
                "params": net.params,
                "averaged-accuracy": net.averaged_accuracy(partitions),
                "local-accuracy": net.mean_local_accuracy(partitions),
                "search-flops": search_flops(ledger, stage_of[net.name]) if ledger else 0,
            }
        )

    stage_of = {"fdnas": "search", **{n.name: n.name for n in cluster_nets}}
    naive_ledger = naive.ledger.summary()
    everyone = list(range(NUM_CLIENTS))
    row("FDNAS", fdnas_net, everyone, result.ledger)
    row("fixed MobileNetV2-like", fixed_net, everyone)
    for net, naive_net in zip(cluster_nets, naive_nets, strict=True):
        tag = net.name.split("-")[-1]
        row(f"FDNAS on cluster {tag}", fdnas_net, net.partitions)
        row(f"CFDNAS cluster {tag}", net, net.partitions, result.ledger)
        row(f"naive-CFDNAS cluster {tag}", naive_net, naive_net.partitions, naive_ledger)
    rows.append(
        {
            "net": "centralised DNAS (one party, all data)",
            "clients": "all data",
            "options": central_net.option_names,
            "flops": central_net.flops,
            "params": central_net.params,
            "averaged-accuracy": central_net.averaged_accuracy(),
            "local-accuracy": central_net.mean_local_accuracy(),
            "search-flops": search_flops(central_result.ledger, "search"),
        }
    )

    print("| net | clients | MFLOPs | params | averaged acc | mean local acc | search TFLOPs |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['net']} | {r['clients']} | {r['flops'] / 1e6:.2f} | {r['params']} | "
            f"{r['averaged-accuracy']:.3f} | {r['local-accuracy']:.3f} | "
            f"{r['search-flops'] / 1e12:.3f} |"
        )
    print()
    cluster_rows = [r for r in rows if r["net"].startswith("CFDNAS")]
    fdnas_rows = [r for r in rows if r["net"].startswith("FDNAS on")]
    naive_rows = [r for r in rows if r["net"].startswith("naive")]
    per_cluster = [r["search-flops"] / search for r in cluster_rows]
    summary = {
        "fdnas_acc": rows[0]["averaged-accuracy"],
        "fixed_acc": rows[1]["averaged-accuracy"],
        "fdnas_mflops": rows[0]["flops"] / 1e6,
        "fixed_mflops": rows[1]["flops"] / 1e6,
        "clusters_acc_ge_fdnas": sum(
            c["averaged-accuracy"] >= f["averaged-accuracy"]
            for c, f in zip(cluster_rows, fdnas_rows, strict=True)
        ),
        "clusters_flops_lt_fdnas": sum(c["flops"] < rows[0]["flops"] for c in cluster_rows),
        "clusters_acc_ge_naive": sum(
            c["averaged-accuracy"] >= n["averaged-accuracy"]
            for c, n in zip(cluster_rows, naive_rows, strict=True)
        ),
        "cluster_compute_pct": 100 * sum(per_cluster) / len(per_cluster),
        "all_clusters_compute_pct": 100 * sum(per_cluster),
        "clusters": len(cluster_rows),
    }
    summary["seconds"] = round(time.perf_counter() - started, 1)
    # a run with other knobs than the defaults is kept next to them, named by its knobs
    suffix = "".join(f".{k.replace('_', '-')}-{v}" for k, v in knobs.items() if v != DEFAULTS[k])
    report(
        "fdnas_clusters" + suffix,
        args.quick,
        summary,
        {
            "knobs": knobs,
            "settings": settings(args.quick, Path("-"), resolved),
            "flops-convention": "FLOPs = 2 x MACs per sample (torch.utils.flop_counter)",
            "rows": rows,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
