"""FDNAS's hardware term on measured latency (``fdnas.resource = "latency"``), both sides.

The server sends a group's latency table (``fedorasflwr.latency.LatencyTable``: the median
of its nodes' tables) with each search message; the client's hardware term is then
``beta log(E[latency] / target)^2`` with

    ``E[latency] = fixed_ms + sum_layers sum_o p_o option_ms[layer][o]``,  ``p = softmax(alpha)``

the latency of a path drawn from the supernet's distribution as the table predicts it
(ProxylessNAS's expected latency, Cai et al. 2019, Eq. 5), differentiable in alpha.  The
derived net is the most probable path whose table latency stays within the target.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from ...latency import LatencyTable
from ...search_spaces.base import SearchSpace
from ...search_spaces.differentiable import most_probable_within

__all__ = [
    "FIXED_MS",
    "OPTION_MS",
    "TARGET_MS",
    "derive_within_ms",
    "expected_latency",
    "latency_config",
    "latency_from_config",
    "path_range_ms",
]

# config keys of a ``train.fdnas_search`` message with the resource latency
TARGET_MS = "target-ms"
OPTION_MS = "latency-option-ms"  # the group table's options, layer-major, flat
FIXED_MS = "latency-fixed-ms"
#: relative slack of a latency bound: a path summing to the bound in floating point fits
SLACK = 1e-9


def expected_latency(
    space: SearchSpace, option_ms: Sequence[Sequence[float]], fixed_ms: float
) -> Tensor:
    """``fixed_ms + sum_layers sum_o softmax(alpha)_o option_ms[layer][o]`` (ms,
    differentiable in alpha)."""
    probabilities = space.probabilities()
    total = torch.tensor(float(fixed_ms), device=probabilities[0].device)
    for probs, layer in zip(probabilities, option_ms, strict=True):
        total = total + (probs * torch.tensor(layer, dtype=probs.dtype, device=probs.device)).sum()
    return total


def path_range_ms(table: LatencyTable) -> tuple[float, float]:
    """Table latency of the cheapest and of the costliest path."""
    low = table.fixed_ms + sum(min(layer) for layer in table.option_ms)
    high = table.fixed_ms + sum(max(layer) for layer in table.option_ms)
    return low, high


def derive_within_ms(space: SearchSpace, table: LatencyTable, bound_ms: float) -> tuple[int, ...]:
    """Argmax alpha per layer if its table latency is within ``bound_ms``, else the most
    probable path under ``softmax(alpha)`` that is (``ValueError`` if none is)."""
    argmax = tuple(int(alpha.detach().argmax()) for alpha in space.arch_parameters())
    bound = bound_ms * (1 + SLACK)
    if table.path_ms(argmax) <= bound:
        return argmax
    low, _ = path_range_ms(table)
    if low > bound:
        raise ValueError(
            f"no path fits in {bound_ms:.4g} ms on the table of {table.device} "
            f"(the cheapest takes {low:.4g} ms)"
        )
    return most_probable_within(space.arch_parameters(), table.option_ms, bound - table.fixed_ms)


def latency_config(table: LatencyTable, target_ms: float) -> dict[str, Any]:
    """The entries of a search message that switch its hardware term to latency."""
    return {
        TARGET_MS: float(target_ms),
        OPTION_MS: [float(v) for layer in table.option_ms for v in layer],
        FIXED_MS: float(table.fixed_ms),
    }


def latency_from_config(
    config: Mapping[str, Any], num_options: Sequence[int]
) -> tuple[list[list[float]], float, float] | None:
    """The table (options per layer, fixed part) and target a search message carries, or
    ``None`` if it asks for the FLOPs term; ``ValueError`` if they are malformed."""
    if TARGET_MS not in config:
        return None
    flat = [float(v) for v in config[OPTION_MS]]
    fixed, target = float(config[FIXED_MS]), float(config[TARGET_MS])
    if len(flat) != sum(num_options):
        raise ValueError(f"{OPTION_MS} has {len(flat)} entries, the space {sum(num_options)}")
    if not all(math.isfinite(v) and v > 0 for v in flat) or not math.isfinite(fixed) or fixed < 0:
        raise ValueError(f"{OPTION_MS} / {FIXED_MS}: not finite milliseconds (> 0, >= 0)")
    if not (math.isfinite(target) and target > 0):
        raise ValueError(f"{TARGET_MS} = {target!r} is not a finite number > 0")
    layers, start = [], 0
    for options in num_options:
        layers.append(flat[start : start + options])
        start += options
    return layers, fixed, target
