"""FDNAS's derivation: the derived net is a probable path pulled toward its stage's target.

The search's hardware term (``client.hardware_loss``) acts on the *expected* FLOPs of a
path drawn from ``softmax(alpha)``.  The derived net is one path, and while the alphas are
near uniform (a short search) the expectation says little about it: the expected FLOPs can
sit at the target as a mixture of the costliest and the cheapest options while the argmax
per layer, decided by differences of a few hundredths, is the costliest path of the space
(or the cheapest).  So the derivation applies the search's log-gap to the path itself:

    ``score(path) = sum_layers log softmax(alpha)[option] - derive_beta log(FLOPs / target)^2``

and the derived net is the path of best score within ``fdnas.max-flops`` (``derive_toward``).
The first term is what the argmax maximises, so a decided search (a layer's option at
p = 0.99 against 0.001: 6.9 nats) keeps its choice against a small gap; an undecided one
lands on the paths nearest the target.  With ``fdnas.hardware-loss = "add-linear"``, whose
search term never asks for more FLOPs, only a path above the target pays the gap
(``both_sides=False``): the argmax stands whenever it fits in the target.

The maximum is searched layer by layer (dynamic programming over the FLOPs spent so far,
on a grid of ``GRID`` steps of the FLOPs range: of two partial paths in one step the more
probable goes on) together with every Pareto path (``probable_frontier``: none other within
``max-flops`` is both cheaper and more probable); the best of both is taken.  A score that
does not rise with the FLOPs (one-sided) is maximised exactly by a Pareto path; the
two-sided maximum is within ``layers x range / GRID`` FLOPs of the exact one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from ...search_spaces.base import SearchSpace
from ...search_spaces.differentiable import probable_frontier

__all__ = ["GRID", "best_path", "derive_toward", "target_gap"]

#: grid steps over the FLOPs range of the layer-by-layer search
GRID = 4096


def target_gap(flops: float, target: float, strength: float, both_sides: bool = True) -> float:
    """``strength log(flops / target)^2`` in nats (0 at the target; below the target only
    with ``both_sides``)."""
    if not strength or (flops <= target and not both_sides):
        return 0.0
    return strength * math.log(flops / target) ** 2


def derive_toward(
    space: SearchSpace,
    target: float,
    strength: float,
    max_flops: float | None = None,
    *,
    both_sides: bool = True,
) -> tuple[int, ...]:
    """The path within ``max_flops`` (absolute FLOPs; ``None``: every path) of best
    ``sum log softmax(alpha) - target_gap(FLOPs, target, strength, both_sides)``,
    ``target`` in absolute FLOPs (> 0); ties go to the cheaper path.  ``strength`` 0 (and,
    one-sided, an argmax within the target): what ``space.derive(max_flops)`` gives, the
    argmax alpha per layer when it fits in ``max_flops``, else the most probable path
    within it.  ``ValueError`` if no path fits in ``max_flops``."""
    derived = space.derive(max_flops)
    if strength == 0 or (not both_sides and space.cost(derived).flops <= target):
        return derived
    fixed = space.fixed_cost.flops
    costs = [
        [float(space.option_cost(layer, o).flops) for o in range(options)]
        for layer, options in enumerate(space.num_options())
    ]
    budget = math.inf if max_flops is None else max_flops - fixed
    return best_path(
        space.arch_parameters(),
        costs,
        budget,
        lambda cost, logp: logp - target_gap(fixed + cost, target, strength, both_sides),
    )


def best_path(
    alphas: Sequence[Tensor],
    costs: Sequence[Sequence[float]],
    budget: float,
    score: Callable[[float, float], float],
) -> tuple[int, ...]:
    """The path of summed option ``costs`` within ``budget`` with the best ``score(cost,
    sum log softmax(alpha))`` among the grid search's paths and the Pareto paths (module
    docstring); ties go to the cheaper.  ``ValueError`` if no path fits in ``budget``."""
    candidates = probable_frontier(alphas, costs, budget) + _grid_paths(alphas, costs, budget)
    best = max(candidates, key=lambda entry: (score(entry[0], entry[1]), -entry[0]))
    return best[2]


def _grid_paths(
    alphas: Sequence[Tensor], costs: Sequence[Sequence[float]], budget: float
) -> list[tuple[float, float, tuple[int, ...]]]:
    """The most probable path found for every grid step of summed cost within ``budget``:
    ``(cost, log-probability, path)``; the cheapest path of every layer always continues,
    so a path that fits stays while the cheapest does."""
    lows = [min(layer) for layer in costs]
    extra = [
        np.asarray(layer, dtype=np.float64) - low for layer, low in zip(costs, lows, strict=True)
    ]
    room = budget - sum(lows)  # what the layers may spend above their cheapest options
    if room < 0:
        return []
    step = max(min(sum(float(e.max()) for e in extra), room) / GRID, 1e-12)
    value, spent = np.zeros(1), np.zeros(1)
    pointers = []
    for alpha, layer_extra in zip(alphas, extra, strict=True):
        logp = torch.log_softmax(alpha.detach().double(), dim=0).cpu().numpy()
        grown_value = (value[:, None] + logp[None, :]).ravel()
        grown_spent = (spent[:, None] + layer_extra[None, :]).ravel()
        fits = np.flatnonzero(grown_spent <= room)
        cell = np.floor(grown_spent[fits] / step).astype(np.int64)
        # per grid cell: the most probable, then the cheaper
        order = np.lexsort((grown_spent[fits], -grown_value[fits], cell))
        first = order[np.r_[True, cell[order][1:] != cell[order][:-1]]]
        kept = fits[first]
        value, spent = grown_value[kept], grown_spent[kept]
        pointers.append(kept)
    paths = []
    for end in range(len(value)):
        state, path = end, []
        for layer_pointers, layer_extra in zip(reversed(pointers), reversed(extra), strict=True):
            flat = int(layer_pointers[state])
            state, option = divmod(flat, len(layer_extra))
            path.append(option)
        paths.append((sum(lows) + float(spent[end]), float(value[end]), tuple(reversed(path))))
    return paths
