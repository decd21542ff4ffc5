"""NSGA-II on spaces and tiers with fewer paths than the population (a user's small space)."""

import itertools

import numpy as np

from fedorasflwr.methods.fedoras.search import initial_paths, search_tier
from fedorasflwr.methods.fedoras.tiers import Tier
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
