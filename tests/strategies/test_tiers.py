"""Tier bounds and client-to-tier assignment (FedorAS Appendix E.4)."""

from collections import Counter

import numpy as np
import pytest

from fedorasflwr.methods.fedoras.runner import tier_entries
from fedorasflwr.methods.fedoras.strategy import FedorASResult
from fedorasflwr.methods.fedoras.tiers import (
    Tier,
    assign_tiers,
    compute_tiers,
    mass_quantile,
    tier_of_flops,
)
from fedorasflwr.search_spaces import build_space


def test_mass_quantile_by_hand():
    flops = np.array([1.0, 2.0, 3.0, 4.0])  # cumulative mass 0.1, 0.3, 0.6, 1.0
    assert mass_quantile(flops, 0.3) == 2.0
    assert mass_quantile(flops, 0.59) == 2.0
    assert mass_quantile(flops, 0.6) == 3.0
    assert mass_quantile(flops, 0.05) == 1.0  # below the first share: the smallest value


def test_tier_membership_is_half_open_except_the_lowest():
    tiers = [Tier(0, 10, 20), Tier(1, 20, 30)]
    assert tier_of_flops(tiers, 10) == 0
    assert tier_of_flops(tiers, 20) == 0
    assert tier_of_flops(tiers, 20.5) == 1
    assert tier_of_flops(tiers, 31) == -1


def test_uniform_assignment_is_balanced_and_seeded():
    ids = list(range(22))
    a = assign_tiers(ids, 4, np.random.default_rng(3))
    assert sorted(Counter(a.values()).values()) == [5, 5, 6, 6]
    assert a == assign_tiers(list(reversed(ids)), 4, np.random.default_rng(3))
    assert a != assign_tiers(ids, 4, np.random.default_rng(4))


def test_proportional_assignment_follows_the_shares():
    a = assign_tiers(range(80), 4, np.random.default_rng(0), (0.8, 0.0125, 0.0125, 0.175))
    assert Counter(a.values()) == {0: 64, 1: 1, 2: 1, 3: 14}


@pytest.fixture(scope="module")
def space():
    return build_space(
        "cnn_s", num_classes=10, in_channels=1, input_height=28, input_width=28, width=0.25
    )


def test_tiers_cover_the_space_contiguously(space):
    tiers = compute_tiers(space, np.random.default_rng(0), num_tiers=4, num_samples=2000)
    assert tiers[0].low == space.min_flops()
    assert tiers[-1].high == space.max_flops()
    for lower, upper in zip(tiers, tiers[1:], strict=False):
        assert lower.high == upper.low
        assert lower.low < lower.high
    # lower tiers split the range below the rho_high point evenly
    widths = [t.high - t.low for t in tiers[:-1]]
    assert max(widths) - min(widths) < 1e-6 * max(widths)


def test_rho_high_puts_the_top_tier_where_the_mass_says(space):
    rng = np.random.default_rng(1)
    tiers = compute_tiers(space, rng, num_tiers=4, num_samples=4000, rho_high=0.8)
    rng = np.random.default_rng(1)
    flops = np.sort([space.cost(space.sample_path(rng)).flops for _ in range(4000)])
    assert tiers[-1].low == pytest.approx(mass_quantile(flops.astype(float), 0.8))


def test_rho_low_widens_the_lowest_tier(space):
    plain = compute_tiers(space, np.random.default_rng(0), num_tiers=4, num_samples=2000)
    wide = compute_tiers(
        space, np.random.default_rng(0), num_tiers=4, num_samples=2000, rho_low=0.3
    )
    assert wide[0].high > plain[0].high
    assert wide[-1].low == plain[-1].low


@pytest.mark.parametrize("tier_index", range(4))
def test_10k_paths_per_tier_stay_within_its_budget_in_a_comm_budget_subspace(space, tier_index):
    """What a client of each tier does in Stage 1: a subspace within B_comm = half the
    supernet and the tier's budget, then 10,000 greedy paths; every kept option that fits
    the budget in some path shows up (``_check_paths`` asserts both)."""
    from tests.search_spaces.test_sampling import _check_paths

    tiers = compute_tiers(space, np.random.default_rng(0), num_tiers=4, num_samples=2000)
    tier = tiers[tier_index]
    rng = np.random.default_rng(tier_index)
    subspace = space.sample_subspace(rng, space.total_size // 2, max_flops=tier.high)
    assert space.subspace_size(subspace) <= space.total_size // 2
    _check_paths(space, rng, tier.high, subspace, samples=10_000)


def test_result_json_tiers_give_flops_bounds_in_macs_too_and_ms_bounds_alone():
    tiers = [Tier(0, 1000.0, 2000.0), Tier(1, 2000.0, 5000.0)]
    # every bound names its unit (issue 41); low / high: the same, kept for old readers
    assert tier_entries(FedorASResult(tiers=tiers)) == [
        {"index": 1, "low": 1000.0, "high": 2000.0, "low-flops": 1000.0, "high-flops": 2000.0,
         "low-macs": 500.0, "high-macs": 1000.0},
        {"index": 2, "low": 2000.0, "high": 5000.0, "low-flops": 2000.0, "high-flops": 5000.0,
         "low-macs": 1000.0, "high-macs": 2500.0},
    ]  # fmt: skip
    # tiers of latency bound milliseconds: no MACs to give
    by_latency = FedorASResult(tiers=[Tier(0, 0.5, 1.5)], resource="latency")
    assert tier_entries(by_latency) == [
        {"index": 1, "low": 0.5, "high": 1.5, "low-ms": 0.5, "high-ms": 1.5}
    ]
