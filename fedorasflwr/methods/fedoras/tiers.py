"""Client tiers of FedorAS (paper §3, Appendix E.4).

Tiers split the FLOPs axis of a search space.  From many uniformly sampled
paths, sorted by FLOPs, the top tier starts where the cumulative share of the
sampled FLOPs mass reaches ``rho_high`` and ends at the space's maximum.  The
range from the cheapest path to that point is split evenly among the lower
tiers; with ``rho_low > 0`` the lowest tier instead ends where the cumulative
mass reaches ``rho_low`` and the middle tiers split the rest evenly.  A
client's training budget is the upper FLOPs bound of its tier.

With run config ``fedoras.resource = "latency"`` the same construction runs on a
path's table latency instead (:class:`PathCost` over a ``LatencyTable``): tier
bounds are milliseconds, and the budgeted samplers (paper Eqs. 1 and 3) spend
milliseconds of that table instead of FLOPs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ...latency import LatencyTable
from ...search_spaces import SearchSpace, Subspace
from ...search_spaces import sampling as _sampling

__all__ = [
    "PathCost",
    "Tier",
    "assign_tiers",
    "compute_tiers",
    "mass_quantile",
    "tier_of_flops",
]

#: relative slack of a latency budget in the samplers (the sums of floats of a table in
#: another order may exceed a budget equal to them by rounding)
LATENCY_SLACK = 1e-9


@dataclass(frozen=True)
class PathCost:
    """What a tier bounds of a path: its FLOPs (``table`` None, the paper) or its table
    latency in milliseconds on ``table`` (``fedoras.resource = "latency"``), with the
    budgeted path and subspace samplers (paper Eqs. 3 and 1) spending that cost."""

    space: SearchSpace
    table: LatencyTable | None = None

    @property
    def name(self) -> str:
        return "flops" if self.table is None else "latency"

    @property
    def unit(self) -> str:
        return "FLOPs" if self.table is None else "ms"

    def of(self, path: Sequence[int]) -> float:
        if self.table is None:
            return float(self.space.cost(path).flops)
        return self.table.path_ms(path)

    def lowest(self) -> float:
        """The cheapest path's cost."""
        if self.table is None:
            return float(self.space.min_flops())
        return self.table.fixed_ms + sum(min(layer) for layer in self.table.option_ms)

    def highest(self) -> float:
        """The dearest path's cost."""
        if self.table is None:
            return float(self.space.max_flops())
        return self.table.fixed_ms + sum(max(layer) for layer in self.table.option_ms)

    def sample_path(
        self, rng: np.random.Generator, budget: float | None, subspace: Subspace | None = None
    ) -> tuple[int, ...]:
        """A path within ``budget`` (greedy uniform sampling, ``SearchSpace.sample_path``)."""
        if self.table is None:
            return self.space.sample_path(rng, max_flops=budget, subspace=subspace)
        space = self.space
        kept = space.full_subspace() if subspace is None else space.validate_subspace(subspace)
        return _sampling.sample_path(
            rng, self.table.option_ms, self.table.fixed_ms, kept, self._slack(budget)
        )

    def sample_subspace(
        self, rng: np.random.Generator, max_size: float, budget: float | None
    ) -> Subspace:
        """A subspace of at most ``max_size`` elements keeping a path within ``budget``
        (``SearchSpace.sample_subspace``)."""
        if self.table is None:
            return self.space.sample_subspace(rng, max_size=max_size, max_flops=budget)
        space = self.space
        sizes = [
            [space.option_size(layer, o) for o in range(n)]
            for layer, n in enumerate(space.num_options())
        ]
        return _sampling.sample_subspace(
            rng,
            self.table.option_ms,
            sizes,
            self.table.fixed_ms,
            space.fixed_size,
            max_size,
            self._slack(budget),
        )

    def violation_floor(self) -> float:
        """The least distance outside a tier NSGA-II's constraint counts (1 FLOP, 1 us)."""
        return 1.0 if self.table is None else 1e-3

    @staticmethod
    def _slack(budget: float | None) -> float | None:
        return None if budget is None else budget * (1 + LATENCY_SLACK) + 1e-12


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
    cost: PathCost | None = None,
) -> list[Tier]:
    """Tier bounds from ``num_samples`` uniformly sampled paths (paper: 100K), on the
    paths' ``cost`` (default: FLOPs; a latency table: milliseconds)."""
    cost = PathCost(space) if cost is None else cost
    lowest, highest = cost.lowest(), cost.highest()
    if num_tiers == 1:
        return [Tier(0, lowest, highest)]
    flops = np.sort(np.array([cost.of(space.sample_path(rng)) for _ in range(num_samples)], float))
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
    slowness: Mapping[int, float] | None = None,
) -> dict[int, int]:
    """Assign partitions to tiers, irrespective of their data (paper E.4).

    Uniform (``proportions`` empty): a seeded permutation dealt into ``num_tiers``
    groups of near-equal size.  Otherwise group sizes follow ``proportions``
    (largest-remainder rounding), e.g. Speech Commands' 80/1.25/1.25/17.5 %.
    With ``slowness`` (per partition, e.g. its device's median path latency), the
    permutation is stably sorted slowest first before it is dealt: the slowest
    devices go to the lowest tier, the fastest to the top one, and equal devices
    stay in the seeded order (all equal: the uniform assignment).
    """
    ids = sorted(partition_ids)
    order = [ids[i] for i in rng.permutation(len(ids))]
    if slowness is not None:
        order.sort(key=lambda pid: -slowness[pid])
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
