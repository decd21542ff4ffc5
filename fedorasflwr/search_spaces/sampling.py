"""Path and subspace sampling over a space's cost tables (FedorAS Eq. 1 and Eq. 3).

Pure functions of per-layer, per-option FLOPs and sizes: ``SearchSpace.sample_path``,
``sample_subspace`` and ``min_subspace_size`` call them with the space's tables.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["CostTable", "Subspace", "min_subspace_size", "sample_path", "sample_subspace"]

Subspace = tuple[tuple[int, ...], ...]
"""Per searchable layer, the sorted indices of the kept options."""

CostTable = Sequence[Sequence[int]]
"""Per layer, per option: FLOPs or sizes."""


def _budget(max_flops: float | None) -> float:
    return math.inf if max_flops is None else float(max_flops)


def _check_cheapest(
    flops: CostTable, fixed_flops: int, kept: Sequence[Sequence[int]], max_flops: float | None
) -> None:
    cheapest = fixed_flops + sum(min(flops[i][o] for o in opts) for i, opts in enumerate(kept))
    if cheapest > _budget(max_flops):
        raise ValueError(
            f"max_flops={max_flops:g} is below the cheapest path ({cheapest} FLOPs, "
            f"of which {fixed_flops} fixed); raise the budget"
        )


def sample_path(
    rng: np.random.Generator,
    flops: CostTable,
    fixed_flops: int,
    kept: Subspace,
    max_flops: float | None,
) -> tuple[int, ...]:
    _check_cheapest(flops, fixed_flops, kept, max_flops)
    budget = _budget(max_flops)
    mins = [min(flops[i][o] for o in opts) for i, opts in enumerate(kept)]
    order = rng.permutation(len(kept)).tolist()
    order = [i for i in order if mins[i] > 0] + [i for i in order if mins[i] == 0]
    draws = rng.random(len(kept)).tolist()
    arch = [0] * len(kept)
    spent, reserve = fixed_flops, sum(mins)
    for draw, layer in zip(draws, order, strict=True):
        # `reserve` (cheapest choice of every unvisited layer) keeps the rest feasible.
        reserve -= mins[layer]
        allowed = [o for o in kept[layer] if spent + flops[layer][o] + reserve <= budget]
        option = allowed[int(draw * len(allowed))]
        arch[layer] = option
        spent += flops[layer][option]
    return tuple(arch)


def sample_subspace(
    rng: np.random.Generator,
    flops: CostTable,
    sizes: CostTable,
    fixed_flops: int,
    fixed_size: int,
    max_size: float,
    max_flops: float | None,
) -> Subspace:
    kept = [list(range(len(layer))) for layer in flops]
    _check_cheapest(flops, fixed_flops, kept, max_flops)
    budget = _budget(max_flops)
    # A layer can shrink down to its smallest kept option (0 if it keeps a
    # non-parametric one): the floor that keeps max_size reachable.
    floors = [min(layer) for layer in sizes]
    if fixed_size + sum(floors) > max_size:
        smallest = min_subspace_size(flops, sizes, fixed_flops, fixed_size, max_flops)
        raise ValueError(
            f"max_size={max_size:g} is below the smallest reachable subspace size {smallest} "
            f"(fixed parts {fixed_size} + one option per layer without a non-parametric one)"
        )
    mins = [min(layer) for layer in flops]
    size = fixed_size + sum(sum(layer) for layer in sizes)
    while size > max_size:
        removable = []
        for layer, opts in enumerate(kept):
            if len(opts) < 2:
                continue
            other_flops = fixed_flops + sum(mins) - mins[layer]
            other_floor = fixed_size + sum(floors) - floors[layer]
            for option in opts:
                if sizes[layer][option] == 0:
                    continue
                rest = [o for o in opts if o != option]
                if other_flops + min(flops[layer][o] for o in rest) > budget:
                    continue
                if other_floor + min(sizes[layer][o] for o in rest) > max_size:
                    continue
                removable.append((layer, option))
        if not removable:
            smallest = min_subspace_size(flops, sizes, fixed_flops, fixed_size, max_flops)
            raise ValueError(
                f"cannot shrink the subspace to max_size={max_size:g}: stuck at {size} "
                f"elements; the smallest subspace with a path within max_flops={max_flops} "
                f"has {smallest} elements"
            )
        layer, option = removable[int(rng.random() * len(removable))]
        kept[layer].remove(option)
        size -= sizes[layer][option]
        mins[layer] = min(flops[layer][o] for o in kept[layer])
        floors[layer] = min(sizes[layer][o] for o in kept[layer])
    return tuple(tuple(opts) for opts in kept)


def min_subspace_size(
    flops: CostTable,
    sizes: CostTable,
    fixed_flops: int,
    fixed_size: int,
    max_flops: float | None,
) -> int:
    """Exact minimum over subspaces keeping all non-parametric options and a path in budget.

    Per layer the cheapest such subspace keeps the non-parametric options plus at
    most one parametric option; a Pareto front of (min FLOPs, size) over layers
    finds the smallest size whose cheapest path fits ``max_flops``.
    """
    budget = _budget(max_flops)
    front = [(fixed_flops, fixed_size)]
    for layer_flops, layer_sizes in zip(flops, sizes, strict=True):
        free = [f for f, s in zip(layer_flops, layer_sizes, strict=True) if s == 0]
        base = min(free, default=math.inf)
        keeps = [(base, 0)] if free else []
        keeps += [(min(base, f), s) for f, s in zip(layer_flops, layer_sizes, strict=True) if s]
        merged = sorted(
            (f0 + f1, s0 + s1) for f0, s0 in front for f1, s1 in keeps if f0 + f1 <= budget
        )
        front = []
        for point in merged:
            if not front or point[1] < front[-1][1]:
                front.append(point)
        if not front:
            raise ValueError(f"no path fits max_flops={max_flops}")
    return int(front[-1][1])
