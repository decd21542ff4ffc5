"""Client tiers of FedorAS (paper §3, Appendix E.4).

Tiers split the FLOPs axis of a search space.  From many uniformly sampled
paths, sorted by FLOPs, the top tier starts where the cumulative share of the
sampled FLOPs mass reaches ``rho_high`` and ends at the space's maximum.  The
range from the cheapest path to that point is split evenly among the lower
tiers; with ``rho_low > 0`` the lowest tier instead ends where the cumulative
mass reaches ``rho_low`` and the middle tiers split the rest evenly.  A
client's training budget is the upper FLOPs bound of its tier.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...search_spaces import SearchSpace

__all__ = ["Tier", "assign_tiers", "compute_tiers", "mass_quantile", "tier_of_flops"]


@dataclass(frozen=True)
class Tier:
    """One tier: paths with ``low < FLOPs <= high`` (the lowest tier includes ``low``)."""

    index: int
    low: float
    high: float

    def contains(self, flops: float) -> bool:
        if self.index == 0:
            return self.low <= flops <= self.high
        return self.low < flops <= self.high


def mass_quantile(sorted_flops: np.ndarray, rho: float) -> float:
    """Largest sampled FLOPs value whose cumulative share of the FLOPs mass is <= ``rho``."""
    cumulative = np.cumsum(sorted_flops) / sorted_flops.sum()
    inside = np.nonzero(cumulative <= rho)[0]
    return float(sorted_flops[inside[-1]] if inside.size else sorted_flops[0])


def compute_tiers(
    space: SearchSpace,
    rng: np.random.Generator,
    *,
    num_tiers: int,
    num_samples: int,
    rho_low: float = 0.0,
    rho_high: float = 0.95,
) -> list[Tier]:
    """Tier bounds from ``num_samples`` uniformly sampled paths (paper: 100K)."""
    lowest = float(space.min_flops())
    highest = float(space.max_flops())
    if num_tiers == 1:
        return [Tier(0, lowest, highest)]
    flops = np.sort(
        np.array([space.cost(space.sample_path(rng)).flops for _ in range(num_samples)], float)
    )
    top = min(max(mass_quantile(flops, rho_high), lowest), highest)
    if rho_low > 0:
        first = min(max(mass_quantile(flops, rho_low), lowest), top)
        inner = np.linspace(first, top, num_tiers - 1)
        bounds = [lowest, *inner.tolist(), highest]
    else:
        bounds = [*np.linspace(lowest, top, num_tiers).tolist(), highest]
    return [Tier(i, bounds[i], bounds[i + 1]) for i in range(num_tiers)]


def tier_of_flops(tiers: Sequence[Tier], flops: float) -> int:
    """Index of the tier a path of ``flops`` FLOPs belongs to (-1 if none)."""
    for tier in tiers:
        if tier.contains(flops):
            return tier.index
    return -1


def assign_tiers(
    partition_ids: Sequence[int],
    num_tiers: int,
    rng: np.random.Generator,
    proportions: Sequence[float] = (),
) -> dict[int, int]:
    """Assign partitions to tiers, irrespective of their data (paper E.4).

    Uniform (``proportions`` empty): a seeded permutation dealt into ``num_tiers``
    groups of near-equal size.  Otherwise group sizes follow ``proportions``
    (largest-remainder rounding), e.g. Speech Commands' 80/1.25/1.25/17.5 %.
    """
    ids = sorted(partition_ids)
    order = [ids[i] for i in rng.permutation(len(ids))]
    n = len(order)
    if proportions:
        exact = np.asarray(proportions, float) * n
        sizes = np.floor(exact).astype(int)
        for i in np.argsort(-(exact - sizes), kind="stable")[: n - sizes.sum()]:
            sizes[i] += 1
    else:
        sizes = np.array(
            [n // num_tiers + (1 if t < n % num_tiers else 0) for t in range(num_tiers)]
        )
    assignment: dict[int, int] = {}
    start = 0
    for tier, size in enumerate(sizes):
        for pid in order[start : start + size]:
            assignment[pid] = tier
        start += size
    return assignment
