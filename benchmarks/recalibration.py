"""What re-estimating BatchNorm statistics costs, against a plain forward pass.

Every score and every export re-estimates a net's BatchNorm statistics first
(``fedorasflwr.training.recalibrate_batchnorm``): one pass over the calibration batches in
train mode, each BatchNorm's per-channel mean and variance pooled over all of them. This
times, side by side in one process on the same batches, per net: a train-mode forward pass
alone; the recalibration as it is (each batch's figures read from the BatchNorm's own forward
at momentum 1); and the pooling it replaced (a hook copying every BatchNorm's input to float64
and summing it and its squares), and how far the two statistics differ.

    python benchmarks/recalibration.py            # 10 timed repeats per net
    python benchmarks/recalibration.py --quick    # CI smoke run (2 repeats)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from common import ROOT, report

if str(ROOT) not in sys.path:  # this checkout's package and its tests' run config
    sys.path.insert(0, str(ROOT))


def float64_copy_pooling(net: Any, batches: list[Any]) -> None:
    """The pooling before issue 44: a pre-hook copies each BatchNorm's input to float64."""
    import torch
    from torch import nn

    norms = [m for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    sums: dict[Any, list[Any]] = {}

    def pool(module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        x = args[0].detach().double().transpose(0, 1).reshape(args[0].shape[1], -1)
        total = sums.setdefault(module, [0.0, 0.0, 0])
        total[0] = total[0] + x.sum(dim=1)
        total[1] = total[1] + (x * x).sum(dim=1)
        total[2] += x.shape[1]

    for m in norms:
        m.reset_running_stats()
    hooks = [m.register_forward_pre_hook(pool) for m in norms]
    net.train()
    with torch.no_grad():
        for inputs in batches:
            net(inputs)
    for hook in hooks:
        hook.remove()
    net.eval()
    for m, (total, squares, count) in sums.items():
        mean = total / count
        var = (squares / count - mean * mean).clamp_min(0.0) * (count / max(count - 1, 1))
        m.running_mean.copy_(mean.float())
        m.running_var.copy_(var.float())


def nets() -> dict[str, tuple[Any, list[Any]]]:
    """The default run's FedorAS supernet, its largest path, on 2 batches of 256 MNIST-sized
    inputs; the mbconv space's largest path (FDNAS) on the same."""
    import torch

    from fedorasflwr.config import parse_run_config
    from fedorasflwr.runs import build_supernet
    from fedorasflwr.search_spaces import build_space
    from tests.runconfig import pyproject_run_config

    torch.manual_seed(0)
    batches = list(torch.randn(512, 1, 28, 28).split(256))
    space = build_supernet(parse_run_config(pyproject_run_config()))
    mbconv = build_space(
        "mbconv", num_classes=10, in_channels=1, input_height=28, input_width=28, width=0.5
    )
    return {
        "fedoras-default-largest": (space.subnet([n - 1 for n in space.num_options()]), batches),
        "mbconv-0.5-largest": (mbconv.subnet([n - 1 for n in mbconv.num_options()]), batches),
    }


def timed(call: Callable[[], None], repeats: int) -> float:
    call()  # warm-up
    seconds = []
    for _ in range(repeats):
        started = time.process_time()
        call()
        seconds.append(time.process_time() - started)
    return statistics.median(seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke run")
    args = parser.parse_args(argv)
    repeats = 2 if args.quick else 10

    import copy

    import torch

    from fedorasflwr.training import recalibrate_batchnorm

    torch.set_num_threads(1)
    cpu = torch.device("cpu")
    rows: dict[str, dict[str, Any]] = {}
    for name, (net, batches) in nets().items():

        def forward(net: Any = net, batches: list[Any] = batches) -> None:
            net.train()
            with torch.no_grad():
                for inputs in batches:
                    net(inputs)

        now, before = copy.deepcopy(net), copy.deepcopy(net)
        forward_s = timed(forward, repeats)
        now_s = timed(lambda n=now, b=batches: recalibrate_batchnorm(n, n, b, cpu), repeats)
        before_s = timed(lambda n=before, b=batches: float64_copy_pooling(n, b), repeats)
        differ = max(
            float(((a - b).abs() / b.abs().clamp_min(1e-6)).max())
            for key, a in now.state_dict().items()
            if key.endswith(("running_mean", "running_var"))
            for b in [before.state_dict()[key]]
        )
        rows[name] = {
            "forward_cpu_s": round(forward_s, 4),
            "recalibration_cpu_s": round(now_s, 4),
            "float64_copy_cpu_s": round(before_s, 4),
            "recalibration_over_forward": round(now_s / forward_s, 3),
            "float64_copy_over_forward": round(before_s / forward_s, 3),
            "max_relative_difference": differ,
        }
    print("| net | forward CPU-s | recalibration | float64 copy | now / before | max rel. diff |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, row in rows.items():
        print(
            f"| {name} | {row['forward_cpu_s']:.3f} | {row['recalibration_cpu_s']:.3f} "
            f"({row['recalibration_over_forward']:.2f}x) | {row['float64_copy_cpu_s']:.3f} "
            f"({row['float64_copy_over_forward']:.2f}x) | "
            f"{row['recalibration_cpu_s'] / row['float64_copy_cpu_s']:.2f} | "
            f"{row['max_relative_difference']:.2g} |"
        )
    summary = {
        f"{name}_now_over_before": round(row["recalibration_cpu_s"] / row["float64_copy_cpu_s"], 3)
        for name, row in rows.items()
    }
    summary["max_relative_difference"] = max(r["max_relative_difference"] for r in rows.values())
    report("recalibration", args.quick, summary, {"repeats": repeats, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
