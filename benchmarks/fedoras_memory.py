"""A client's peak memory for one training step: FedorAS single path vs DARTS-style mixed.

Over the FedorAS supernets (``cnn_s``, ``cnn_l``), one local SGD step (forward,
backward, SGD with momentum 0.9) is measured, side by side, on the same supernet
and the same batch:

- **single path** (FedorAS / SPOS): ``space(x, arch)`` runs one path; measured
  for seeded uniformly sampled paths (a top-tier client, no FLOPs budget) and
  for the *largest* path (the most expensive option in every layer);
- **mixed** (DARTS / FedNAS): every option of every layer runs on the layer's
  input and the outputs are summed with ``softmax(alpha)`` weights, the alphas
  being ``nn.Parameter`` updated in the same step (:func:`mixed_forward`, built
  from the space's own option modules; the spaces are not changed).

Each measurement runs in a fresh process (forked from a server that has only
imported torch; one torch thread; glibc ``M_MMAP_THRESHOLD`` 64 KiB so freed
tensors leave the RSS at once) after a batch-2 warm-up pass, and reports:

- **activations**: bytes of the distinct tensors autograd saves for backward
  (``torch.autograd.graph.saved_tensors_hooks``; parameters excluded) -
  deterministic, the part of the peak that grows with the batch;
- **RSS peak**: the process's peak resident memory during the step minus its
  resident memory just before (``/proc/self/clear_refs`` resets the peak;
  ``ru_maxrss`` if that is not available) - what the device really pays,
  including gradients, momentum buffers and temporaries;
- ``torch.cuda.max_memory_allocated`` on top, when CUDA is present.

The paper (Tab. 3 / Tab. 12, App. E.6) reports FedorAS at batch 128 with about
half the peak of FedNAS at batch 32 (1996 vs 3837 MB), and 998 vs 7674 MB at
batch 64 each; the ``paper-like`` ratio below is single path at the largest
batch over mixed at the smallest one.  Prints a Markdown table and
``headline: ...``; writes ``benchmarks/results/fedoras_memory.json``
(``.quick.json`` for ``--quick``).

    python benchmarks/fedoras_memory.py            # cnn_s, cnn_l (width 1); batch 32, 128
    python benchmarks/fedoras_memory.py --quick    # CI smoke run (< 1 minute)
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import multiprocessing
import resource
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

MB = 2**20

__all__ = ["ArchitectureWeights", "mixed_forward", "saved_activation_bytes"]


# ------------------------------------------------------------ DARTS-style mixing
class ArchitectureWeights(nn.Module):
    """DARTS architecture parameters: one ``alpha`` vector per searchable layer (zeros)."""

    def __init__(self, num_options: Sequence[int]) -> None:
        super().__init__()
        self.alphas = nn.ParameterList(nn.Parameter(torch.zeros(n)) for n in num_options)

    def forward(self) -> list[Tensor]:
        """The mixing weights ``softmax(alpha)`` of every layer."""
        return [torch.softmax(alpha, dim=0) for alpha in self.alphas]


def mixed_forward(space: nn.Module, x: Tensor, weights: Sequence[Tensor]) -> Tensor:
    """Logits of the DARTS-style mixed supernet: every layer is ``sum_o w_o * op_o(input)``.

    ``space`` is a ``cnn_l`` / ``cnn_s`` space; ``weights[l]`` holds one weight
    per option of layer ``l``.  Mirrors ``ConvSupernet.forward`` (stem, blocks
    and reductions, head and classifier) with the space's own modules, so one-hot
    weights give exactly ``space(x, arch)``.
    """
    from fedorasflwr.search_spaces.cnn import ConvSupernet

    net = space.net
    if not isinstance(net, ConvSupernet):
        raise TypeError(f"mixed_forward supports cnn_l / cnn_s spaces, got {type(net).__name__}")
    if len(weights) != len(space.choices):
        raise ValueError(f"expected {len(space.choices)} weight vectors, got {len(weights)}")
    x = net.stem(x)
    layer_weights = iter(weights)
    for block, reduction in zip(net.blocks, net.reductions, strict=True):
        for layer in block.layers:
            w = next(layer_weights)
            x = sum(w[o] * layer.ops[key](x) for o, key in enumerate(layer.option_keys))
        x = reduction(x)
    return net.classify(x)


@contextlib.contextmanager
def saved_activation_bytes(exclude: Sequence[Tensor] = ()) -> Iterator[dict[str, int]]:
    """Count the bytes of distinct storages autograd saves for backward inside the block.

    Yields a dict whose ``"bytes"`` is filled on exit.  Storages of ``exclude``
    (the parameters) are not counted; a storage saved by several ops counts once.
    """
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen: dict[int, int] = {}

    def pack(tensor: Tensor) -> Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in skip:
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    out = {"bytes": 0}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        yield out
    out["bytes"] = sum(seen.values())


# ------------------------------------------------------------------ one worker
def _status_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return _status_kb("VmHWM") is not None


def _peak_rss_kb(resettable: bool) -> int:
    if resettable:
        return _status_kb("VmHWM") or 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB on Linux


def _free_large_blocks_at_once() -> None:
    """glibc: serve blocks >= 64 KiB by mmap, so freed tensors leave the RSS at once."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").mallopt(-3, 65536)  # M_MMAP_THRESHOLD


def measure(space_name: str, width: float, batch: int, mode: str, path_seed: int) -> dict[str, Any]:
    """One training step of ``mode`` (``sampled`` / ``largest`` / ``mixed``) in this process."""
    import numpy as np

    from fedorasflwr.search_spaces import build_space

    torch.set_num_threads(1)
    _free_large_blocks_at_once()
    torch.manual_seed(0)
    space = build_space(space_name, width=width).train()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    space.to(device)
    arch: tuple[int, ...] | None = None
    alphas = None
    if mode == "sampled":
        arch = space.sample_path(np.random.default_rng(path_seed))
    elif mode == "largest":
        arch = tuple(
            max(range(len(c.options)), key=lambda o, i=i: space.option_cost(i, o).flops)
            for i, c in enumerate(space.choices)
        )
    elif mode == "mixed":
        alphas = ArchitectureWeights(space.num_options()).to(device)
    else:
        raise ValueError(f"mode must be sampled, largest or mixed, got {mode!r}")
    params = list(space.parameters()) + (list(alphas.parameters()) if alphas else [])
    optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    num_classes = int(space.spec["num_classes"])

    def loss_of(inputs: Tensor, labels: Tensor) -> Tensor:
        logits = space(inputs, arch) if alphas is None else mixed_forward(space, inputs, alphas())
        return loss_fn(logits, labels)

    def batch_of(size: int) -> tuple[Tensor, Tensor]:
        generator = torch.Generator().manual_seed(size)
        inputs = torch.randn((size, *space.input_shape), generator=generator)
        labels = torch.randint(num_classes, (size,), generator=generator)
        return inputs.to(device), labels.to(device)

    # Warm-up: kernels, lazy initialisation and the allocator, not counted.
    loss_of(*batch_of(2)).backward()
    optimizer.zero_grad(set_to_none=True)
    inputs, labels = batch_of(batch)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        cuda_before = torch.cuda.memory_allocated()
    resettable = _reset_peak_rss()
    rss_before = _status_kb("VmRSS") if resettable else _peak_rss_kb(False)
    started = time.perf_counter()
    with saved_activation_bytes(params) as saved:
        loss = loss_of(inputs, labels)
    loss.backward()
    optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    rss_peak = _peak_rss_kb(resettable)
    state_bytes = sum(
        t.numel() * t.element_size()
        for p in params
        for t in [p.grad, optimizer.state.get(p, {}).get("momentum_buffer")]
        if t is not None
    )
    return {
        "space": space_name,
        "width": width,
        "batch": batch,
        "mode": mode,
        "arch": list(arch) if arch is not None else None,
        "flops": space.cost(arch).flops if arch is not None else None,
        "activation_bytes": saved["bytes"],
        "grad_momentum_bytes": state_bytes,
        "param_bytes": sum(p.numel() * p.element_size() for p in params),
        "rss_peak_delta_bytes": max(0, rss_peak - (rss_before or 0)) * 1024,
        "rss_peak_resettable": resettable,
        "cuda_peak_delta_bytes": (
            torch.cuda.max_memory_allocated() - cuda_before if device.type == "cuda" else None
        ),
        "step_seconds": seconds,
    }


def _worker_context() -> multiprocessing.context.BaseContext:
    """Fresh processes forked from a server that has imported torch but run nothing."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "fedorasflwr.search_spaces"])
    return context


def measure_in_fresh_process(
    space_name: str, width: float, batch: int, mode: str, path_seed: int = 0
) -> dict[str, Any]:
    """:func:`measure` in a new process, so no earlier step inflates the peak."""
    with ProcessPoolExecutor(max_workers=1, mp_context=_worker_context()) as pool:
        return pool.submit(measure, space_name, width, batch, mode, path_seed).result()


# ------------------------------------------------------------------ the report
def settings(quick: bool) -> dict[str, Any]:
    if quick:
        return {"spaces": {"cnn_s": 0.5, "cnn_l": 0.125}, "batches": [8, 32], "paths": 1}
    return {"spaces": {"cnn_s": 1.0, "cnn_l": 1.0}, "batches": [32, 128], "paths": 3}


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else float("nan")


def run(quick: bool) -> dict[str, Any]:
    config = settings(quick)
    rows = []
    for space_name, width in config["spaces"].items():
        for batch in config["batches"]:
            sampled = [
                measure_in_fresh_process(space_name, width, batch, "sampled", seed)
                for seed in range(config["paths"])
            ]
            largest = measure_in_fresh_process(space_name, width, batch, "largest")
            mixed = measure_in_fresh_process(space_name, width, batch, "mixed")
            row = {"space": space_name, "width": width, "batch": batch}
            for key in ("activation_bytes", "rss_peak_delta_bytes", "cuda_peak_delta_bytes"):
                if mixed[key] is None:
                    continue
                short = key.removesuffix("_bytes")
                row[f"sampled_{short}"] = statistics.mean(m[key] for m in sampled)
                row[f"largest_{short}"] = largest[key]
                row[f"mixed_{short}"] = mixed[key]
                row[f"sampled_over_mixed_{short}"] = _ratio(row[f"sampled_{short}"], mixed[key])
                row[f"largest_over_mixed_{short}"] = _ratio(largest[key], mixed[key])
            row["runs"] = [*sampled, largest, mixed]
            rows.append(row)
    return {"quick": quick, "settings": config, "rows": rows, "headline": headline(rows, config)}


def headline(rows: list[dict[str, Any]], config: dict[str, Any]) -> dict[str, Any]:
    small, large = min(config["batches"]), max(config["batches"])
    paper_like = [
        _ratio(
            next(r for r in rows if r["space"] == s and r["batch"] == large)[
                "sampled_rss_peak_delta"
            ],
            next(r for r in rows if r["space"] == s and r["batch"] == small)[
                "mixed_rss_peak_delta"
            ],
        )
        for s in config["spaces"]
    ]
    return {
        "single_over_mixed_activation": statistics.median(
            r["sampled_over_mixed_activation"] for r in rows
        ),
        "single_over_mixed_rss": statistics.median(
            r["sampled_over_mixed_rss_peak_delta"] for r in rows
        ),
        "largest_over_mixed_activation": statistics.median(
            r["largest_over_mixed_activation"] for r in rows
        ),
        "largest_over_mixed_rss": statistics.median(
            r["largest_over_mixed_rss_peak_delta"] for r in rows
        ),
        f"paper_like_single{large}_over_mixed{small}_rss": statistics.median(paper_like),
        "paper_fedoras128_over_fednas32": 0.52,  # Tab. 3: 1996 / 3837 MB
    }


def print_report(result: dict[str, Any]) -> None:
    print(
        "| space (width) | batch | activations MB: sampled / largest / mixed | "
        "single/mixed (sampled, largest) | RSS peak MB: sampled / largest / mixed | "
        "single/mixed (sampled, largest) |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for r in result["rows"]:
        act = [r[f"{m}_activation"] / MB for m in ("sampled", "largest", "mixed")]
        rss = [r[f"{m}_rss_peak_delta"] / MB for m in ("sampled", "largest", "mixed")]
        print(
            f"| {r['space']} ({r['width']:g}) | {r['batch']} "
            f"| {act[0]:.1f} / {act[1]:.1f} / {act[2]:.1f} "
            f"| {r['sampled_over_mixed_activation']:.2f}, {r['largest_over_mixed_activation']:.2f} "
            f"| {rss[0]:.1f} / {rss[1]:.1f} / {rss[2]:.1f} "
            f"| {r['sampled_over_mixed_rss_peak_delta']:.2f}, "
            f"{r['largest_over_mixed_rss_peak_delta']:.2f} |"
        )
    print()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke run")
    args = parser.parse_args(argv)
    from common import report  # the benchmarks folder is on sys.path when run as a script

    result = run(args.quick)
    print_report(result)
    report("fedoras_memory", args.quick, result.pop("headline"), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
