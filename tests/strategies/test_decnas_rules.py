"""DecNAS's math against hand-computed values: groups, budgets, rounds, dropping, queueing."""

from __future__ import annotations

import numpy as np
import pytest

from fedorasflwr.methods.decnas.grouping import (
    balance_ratio,
    group_clients,
    mean_label_distance,
    random_groups,
    schedule_waves,
)
from fedorasflwr.methods.decnas.netadapt import (
    budget,
    degradation,
    pick_global_model,
    rank_candidates,
    rounds_for,
    survivors_after_drop,
)


def test_greedy_grouping_by_hand():
    # sizes 10, 10, 5, 5; labels all-0, all-1, all-0, all-1; global = (1/2, 1/2)
    sizes = [10, 10, 5, 5]
    labels = [[10, 0], [0, 10], [5, 0], [0, 5]]
    # client 0 -> empty group 0; client 1 -> the empty (smallest) group 1; client 2: both
    # groups hold 10, group 1 gets closer to (1/2, 1/2) (distance 1 -> 1/3), group 0 not;
    # client 3: group 1 (15 + 5 > 1.1 x 10) is out of balance, so group 0.
    assert group_clients(sizes, labels, 2, 1.1) == [[0, 3], [1, 2]]
    assert balance_ratio([[0, 3], [1, 2]], sizes) == 1.0
    assert mean_label_distance([[0, 3], [1, 2]], labels) == pytest.approx(1 / 3)
    assert mean_label_distance([[0, 2], [1, 3]], labels) == pytest.approx(1.0)


def _skewed(seed: int, clients: int = 60, classes: int = 10):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(20, 81, size=clients)
    labels = [rng.multinomial(n, rng.dirichlet([0.1] * classes)) for n in sizes]
    return [int(n) for n in sizes], [[int(v) for v in row] for row in labels]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_groups_are_balanced_and_closer_to_the_global_labels_than_random(seed):
    sizes, labels = _skewed(seed)
    groups = group_clients(sizes, labels, 6, 1.1)
    assert sorted(c for g in groups for c in g) == list(range(60))
    assert balance_ratio(groups, sizes) <= 1.1
    ours = mean_label_distance(groups, labels)
    rng = np.random.default_rng(seed)
    random = [mean_label_distance(random_groups(rng, 60, 6), labels) for _ in range(20)]
    assert ours < min(random)
    assert group_clients(sizes, labels, 6, 1.1) == groups  # deterministic


def test_more_groups_than_clients_gives_one_client_each():
    assert group_clients([3, 2], [[1, 2], [2, 0]], 5, 1.1) == [[0], [1]]


def test_budget_schedule_by_hand():
    assert budget(1000, 1000, 1, 0.05, 0.93, 0) == 950  # dR_1 = 5% of Res(GM_0)
    assert budget(950, 1000, 2, 0.05, 0.93, 0) == pytest.approx(950 - 50 * 0.93)
    assert budget(950, 1000, 2, 0.05, 0.93, 920) == 920  # never below the target
    with pytest.raises(ValueError):
        budget(950, 1000, 0, 0.05, 0.93, 0)


def test_dynamic_round_schedule():
    schedule = (2, 5, 8, 10)  # paper, CelebA: iterations 1-5, 6-10, 11-15, later
    rounds = [rounds_for(t, schedule, 5) for t in (1, 5, 6, 10, 11, 16, 40)]
    assert rounds == [2, 2, 5, 5, 8, 10, 10]


def test_global_model_pick_by_hand():
    # GM_{t-1}: accuracy 0.90 at 1000 MACs. Candidate 0 saves 100 and loses 0.02 (ratio
    # 2e-4); candidate 1 saves 400 and loses 0.04 (1e-4): the smaller degradation, the less
    # accurate; candidate 2 has no accuracy (no replies): ratio inf.
    accuracy = {0: 0.88, 1: 0.86}
    ratios = {c: degradation(0.9, accuracy[c], 1000, r) for c, r in ((0, 900), (1, 600))}
    ratios[2] = float("inf")
    assert ratios[0] == pytest.approx(2e-4) and ratios[1] == pytest.approx(1e-4)
    assert pick_global_model(ratios, accuracy) == 1  # the default: smallest degradation
    assert pick_global_model(ratios, accuracy, "degradation") == 1
    assert pick_global_model(ratios, accuracy, "accuracy") == 0  # the paper's most accurate
    assert pick_global_model({2: float("inf"), 3: 0.5}, {3: 0.1}, "accuracy") == 3
    assert pick_global_model({4: 0.1, 3: 0.2}, {4: 0.5, 3: 0.5}, "accuracy") == 3  # tie: lower
    with pytest.raises(ValueError, match="unknown pick rule"):
        pick_global_model(ratios, accuracy, "latest")


def test_degradation_and_dropping_by_hand():
    assert degradation(0.9, 0.85, 1000, 900) == pytest.approx(0.0005)
    with pytest.raises(ValueError):
        degradation(0.9, 0.85, 1000, 1000)
    ratios = {0: 0.1, 1: 0.3, 2: 0.2, 3: 0.4, 4: 0.0, 5: 0.5}
    assert rank_candidates(ratios) == [4, 0, 2, 1, 3, 5]
    # ceil(0.33 x 6) = 2 dropped per round: the two largest degradations
    assert survivors_after_drop(ratios, 6, 0.33) == [4, 0, 2, 1]
    # a later round still drops 2 of the initial 6, never the last one
    assert survivors_after_drop({4: 0.1, 0: 0.0}, 6, 0.33) == [0]
    assert survivors_after_drop({4: 0.1}, 6, 0.33) == [4]
    assert survivors_after_drop(ratios, 6, 0.0) == [4, 0, 2, 1, 3, 5]
    assert survivors_after_drop(ratios, 6, 1.0) == [4]
    assert survivors_after_drop({0: 0.2, 1: 0.2}, 2, 0.5) == [0]  # ties: lower index kept


def test_candidates_queue_for_free_groups():
    waves = schedule_waves([0, 1, 2, 3, 4], [2, 0, 1])
    assert waves == [[(0, 2), (1, 0), (2, 1)], [(3, 2), (4, 0)]]
    assert schedule_waves([7], [1, 0]) == [[(7, 1)]]
