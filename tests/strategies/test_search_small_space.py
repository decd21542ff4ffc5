"""NSGA-II on spaces and tiers with fewer paths than the population (a user's small space)."""

import itertools

import numpy as np
import pytest

from fedorasflwr.latency import LatencyTable
from fedorasflwr.methods.fedoras.search import initial_paths, search_tier
from fedorasflwr.methods.fedoras.tiers import PathCost, Tier
from tests.search_spaces.test_base import ToySpace


def _score_by_index(paths):
    return [0.1 + 0.2 * p[0] + 0.3 * p[1] for p in paths]


def test_search_of_a_four_path_space_scores_every_path_and_stops():
    space = ToySpace()
    every = list(itertools.product(*(range(n) for n in space.num_options())))
    assert len(every) == 4  # far under 100 paths, under the population
    tier = Tier(index=0, low=space.min_flops(), high=space.max_flops())
    found = search_tier(
        space, tier, _score_by_index, seed=0, population=8, offspring=8, evaluations=40
    )
    assert sorted(s.path for s in found.evaluated) == sorted(every)
    assert found.best == (1, 1)
    assert found.best_accuracy == _score_by_index([(1, 1)])[0]


def test_a_narrow_tier_shrinks_the_population_instead_of_failing():
    space = ToySpace()
    cheapest = space.min_flops()
    tier = Tier(index=0, low=cheapest, high=cheapest)  # only the cheapest path(s) fit
    start = initial_paths(space, tier, np.random.default_rng(0), 8)
    assert 1 <= len(start) < 8
    found = search_tier(
        space, tier, _score_by_index, seed=1, population=8, offspring=4, evaluations=16
    )
    assert tier.contains(space.cost(found.best).flops)


def _table(space, option_ms, fixed_ms):
    return LatencyTable(space.spec, "cpu", 1, option_ms, fixed_ms)


def test_a_tier_its_devices_cannot_reach_gets_the_least_violating_path_not_an_error():
    # by latency the tiers are cut on every node's table; the tier's own devices (here 2x
    # slower) may have no path within its upper bound (seen in CI under load)
    space = ToySpace()
    every_node = _table(space, ((0.5, 0.25), (0.1, 1.0)), 0.5)
    slow = _table(space, ((1.0, 0.5), (0.2, 2.0)), 1.0)
    tier = Tier(index=0, low=0.5, high=1.0)
    cost, placement = PathCost(space, slow), PathCost(space, every_node)
    assert cost.lowest() == pytest.approx(1.7)  # fastest on its devices: (1, 0), above 1.0
    start = initial_paths(space, tier, np.random.default_rng(0), 8, cost=cost, placement=placement)
    assert start == [(1, 0)]  # the fastest paths of the tier's devices, as its clients train
    found = search_tier(
        space,
        tier,
        _score_by_index,
        seed=1,
        population=8,
        offspring=4,
        evaluations=16,
        objective="latency",
        cost=cost,
        placement=placement,
    )
    assert not any(e.feasible for e in found.evaluated)
    # least violating: (1, 0) is 0.7 ms over the bound, every other path more
    assert found.best == (1, 0)
