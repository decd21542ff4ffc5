"""FedorAS Stage 2: NSGA-II over integer-encoded paths, one search per tier (paper §3.2).

A path is a vector of option indices, one per searchable layer.  The two
objectives are the validation error of the path with the supernet's weights
and its cost (FLOPs or parameters); the constraint keeps the path's FLOPs in
its tier's range.  With ``fedoras.resource = "latency"`` the cost and the
constraint are the path's table latency on the tier's devices (``PathCost``).
pymoo's NSGA-II drives the search through ask/tell, so the scoring of a
generation can be anything that maps paths to accuracies: the server's
held-out slice, or a federated round trip (see ``FedorAS``).  Scores are
memoised per path: a path NSGA-II proposes again costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pymoo.algorithms.moo.nsga2 import NSGA2
from pymoo.core.problem import Problem
from pymoo.operators.crossover.sbx import SBX
from pymoo.operators.mutation.pm import PM
from pymoo.operators.repair.rounding import RoundingRepair
from pymoo.problems.static import StaticProblem
from scipy.stats import kendalltau

from ...costs import flops_to_macs
from ...search_spaces import SearchSpace
from ...seeding import numpy_stream
from .tiers import PathCost, Tier

__all__ = ["Scored", "TierBound", "TierSearch", "initial_paths", "kendall_tau", "search_tier"]

Path = tuple[int, ...]
#: paths -> accuracy of each (one generation at a time)
ScoreFn = Callable[[list[Path]], list[float]]


@dataclass(frozen=True)
class Scored:
    """One evaluated path."""

    path: Path
    accuracy: float
    flops: int
    params: int
    feasible: bool
    generation: int
    #: table latency on the tier's devices (``fedoras.resource = "latency"``)
    latency_ms: float | None = None

    @property
    def macs(self) -> int:
        """MACs of one sample (``flops / 2``; the papers' "FLOPs")."""
        return int(flops_to_macs(self.flops))


@dataclass
class TierSearch:
    """Outcome of one tier's search (``tier``: 0-based; ``summary()``'s: 1-based)."""

    tier: int
    best: Path
    best_accuracy: float
    evaluated: list[Scored] = field(default_factory=list)
    front: list[Path] = field(default_factory=list)
    generations: int = 0
    #: with both scorings: the federated accuracy of each ``evaluated`` path
    federated_accuracy: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "tier": self.tier + 1,  # 1-based, as users see it
            "best": list(self.best),
            "best-accuracy": self.best_accuracy,
            "evaluated": len(self.evaluated),
            "feasible": sum(s.feasible for s in self.evaluated),
            "generations": self.generations,
            "front": [list(p) for p in self.front],
            "points": [
                {
                    "path": list(e.path),
                    "accuracy": e.accuracy,
                    "flops": e.flops,
                    "macs": e.macs,
                    "params": e.params,
                    "feasible": e.feasible,
                    "generation": e.generation,
                    **({} if e.latency_ms is None else {"latency-ms": e.latency_ms}),
                    **(
                        {"federated-accuracy": self.federated_accuracy[i]}
                        if self.federated_accuracy
                        else {}
                    ),
                }
                for i, e in enumerate(self.evaluated)
            ],
        }


def initial_paths(
    space: SearchSpace,
    tier: Tier,
    rng: np.random.Generator,
    count: int,
    tries: int = 200,
    cost: PathCost | None = None,
    placement: PathCost | None = None,
) -> list[Path]:
    """Up to ``count`` distinct paths, as many as ``tries x count`` draws find inside the tier.

    Paths are drawn with the budgeted sampler (never above the tier's upper
    bound) and kept when above its lower bound; if the tier is too narrow to
    fill the population, the rest are the sampler's other (infeasible) draws.
    A small space or a narrow tier may hold fewer than ``count`` distinct
    paths: then all that were found are returned (the search's population
    shrinks to them).  ``cost``: what the tier's upper bound limits (default: FLOPs);
    ``placement``: what its lower bound is measured on (default: ``cost``).

    By latency, a tier's devices may be too slow for any path within its upper bound (the
    tiers are cut on every node's table, ``cost`` is the tier's own): then every path is
    outside, and the draws are the fastest paths on ``cost``, what the tier's clients
    train (the search returns the least violating path it scores).
    """
    cost = PathCost(space) if cost is None else cost
    bound = TierBound(tier, cost, cost if placement is None else placement)
    budget = max(tier.high, cost.lowest())
    inside: dict[Path, None] = {}
    outside: dict[Path, None] = {}
    for _ in range(tries * count):
        path = cost.sample_path(rng, budget)
        (inside if bound.violation(path) == 0 else outside)[path] = None
        if len(inside) >= count:
            break
    paths = list(inside)[:count]
    paths += list(outside)[: count - len(paths)]
    return paths


@dataclass(frozen=True)
class TierBound:
    """Whether a path lies in ``tier``: its ``cost`` within the upper bound and its
    ``placement`` above the lower one (the lowest tier includes its lower bound).

    With FLOPs both are the path's FLOPs (``Tier.contains``). With latency, ``cost`` is
    the table of the tier's devices (the model must run within the bound there) and
    ``placement`` the table the tiers were cut on (all nodes'): a faster tier whose own
    table never reaches its lower bound still has paths that belong to it."""

    tier: Tier
    cost: PathCost
    placement: PathCost

    def violation(self, path: Path) -> float:
        """0 inside the tier, else the distance to it (at least 1 FLOP, 1 us) relative to
        its width (> 0)."""
        tier, value = self.tier, self.cost.of(path)
        placed = value if self.placement is self.cost else self.placement.of(path)
        under = placed < tier.low if tier.index == 0 else placed <= tier.low
        if not under and value <= tier.high:
            return 0.0
        floor = self.cost.violation_floor()
        width = max(tier.high - tier.low, floor)
        return max(max(tier.low - placed, 0.0) + max(value - tier.high, 0.0), floor) / width


def search_tier(
    space: SearchSpace,
    tier: Tier,
    score: ScoreFn,
    *,
    seed: int,
    population: int,
    offspring: int,
    evaluations: int,
    objective: str = "flops",
    on_generation: Callable[[int, list[Scored]], None] | None = None,
    cost: PathCost | None = None,
    placement: PathCost | None = None,
) -> TierSearch:
    """NSGA-II (pymoo, ask/tell) over ``space``'s paths inside ``tier``.

    Minimises (1 - accuracy, cost) subject to the tier's range, until
    ``evaluations`` paths have been scored.  The best-accuracy feasible path
    wins (ties: the cheaper); with no feasible path, the least-violating one.
    ``cost`` is what the tier's upper bound limits (default: FLOPs); a latency
    ``cost`` (the table of the tier's devices) is, with ``objective`` "latency", also
    the second objective; ``placement`` is what the lower bound is measured on (the
    tiers' own table; default: ``cost``), see :class:`TierBound`.
    """
    cost = PathCost(space) if cost is None else cost
    bound = TierBound(tier, cost, cost if placement is None else placement)
    if objective not in ("flops", "params", "latency"):
        raise ValueError(f"objective must be 'flops', 'params' or 'latency', got {objective!r}")
    if objective == "latency" and cost.table is None:
        raise ValueError("objective 'latency' needs a latency cost (a table of the tier)")
    sizes = np.asarray(space.num_options())
    problem = Problem(
        n_var=len(sizes), n_obj=2, n_ieq_constr=1, xl=np.zeros(len(sizes)), xu=sizes - 1.0
    )
    rng = numpy_stream(seed, "nsga2", tier.index)
    start = np.asarray(
        initial_paths(space, tier, rng, population, cost=cost, placement=bound.placement),
        dtype=float,
    )
    algorithm = NSGA2(
        pop_size=len(start),
        n_offsprings=offspring,
        sampling=start,
        crossover=SBX(prob=0.9, eta=15, vtype=float, repair=RoundingRepair()),
        mutation=PM(eta=20, vtype=float, repair=RoundingRepair()),
        eliminate_duplicates=True,
    )
    algorithm.setup(
        problem, termination=("n_eval", evaluations), seed=int(rng.integers(2**31)), verbose=False
    )
    memo: dict[Path, Scored] = {}
    generation = 0
    while algorithm.has_next():
        pop = algorithm.ask()
        # pymoo returns None (or an empty population) when mating yields no
        # offspring that is not a duplicate: a small tier is exhausted
        if pop is None or len(pop) == 0:
            break
        paths = [tuple(int(round(v)) for v in x) for x in pop.get("X")]
        new = list(dict.fromkeys(p for p in paths if p not in memo))
        if new:
            accuracies = score(new)
            for path, accuracy in zip(new, accuracies, strict=True):
                counted = space.cost(path)
                latency = None if cost.table is None else cost.table.path_ms(path)
                memo[path] = Scored(
                    path,
                    float(accuracy),
                    int(counted.flops),
                    int(counted.params),
                    bound.violation(path) == 0,
                    generation,
                    latency,
                )
        if on_generation is not None:
            on_generation(generation, [memo[p] for p in new])
        scored = [memo[p] for p in paths]
        objectives = np.array([[1.0 - s.accuracy, _objective(s, objective)] for s in scored])
        constraints = np.array([[bound.violation(s.path)] for s in scored])
        # the algorithm's own evaluator, so that its n_eval termination counts these
        algorithm.evaluator.eval(StaticProblem(problem, F=objectives, G=constraints), pop)
        algorithm.tell(infills=pop)
        generation += 1
    evaluated = sorted(memo.values(), key=lambda s: (s.generation, s.path))
    feasible = [s for s in evaluated if s.feasible]
    if feasible:
        best = min(feasible, key=lambda s: (-s.accuracy, cost.of(s.path), s.path))
    else:
        best = min(evaluated, key=lambda s: (bound.violation(s.path), -s.accuracy))
    front = []
    if algorithm.opt is not None:
        front = sorted({tuple(int(round(v)) for v in x) for x in algorithm.opt.get("X")})
    return TierSearch(
        tier=tier.index,
        best=best.path,
        best_accuracy=best.accuracy,
        evaluated=evaluated,
        front=front,
        generations=generation,
    )


def _objective(scored: Scored, objective: str) -> float:
    if objective == "latency":
        return float(scored.latency_ms)  # type: ignore[arg-type]
    return float(scored.flops if objective == "flops" else scored.params)


def kendall_tau(first: Sequence[float], second: Sequence[float]) -> float | None:
    """Kendall's tau-b between two scorings of the same paths (``None`` if undefined)."""
    if len(first) < 2:
        return None
    value = kendalltau(first, second).statistic
    return None if not np.isfinite(value) else float(value)
