"""``benchmarks/tier_pools.py`` (issue 40, item 3): which classes each tier's fine-tuning
clients hold. Hand-computed pools on a made-up split, then one recorded case's split
rebuilt from MNIST-5k and checked against the partitions themselves."""

from __future__ import annotations

import pytest

from tests.test_benchmarks import load_benchmark

COUNTS = {  # partition -> training label counts over 3 classes
    0: [10, 0, 0],
    1: [5, 5, 0],
    2: [0, 0, 1],
    3: [0, 30, 0],
}
TIER_OF = {0: 1, 1: 2, 2: 2, 3: 3}


def test_a_tiers_pool_is_its_clients_and_those_of_the_tiers_above():
    pools = load_benchmark("tier_pools")
    assert pools.pool_counts(COUNTS, TIER_OF, 1) == ([15, 35, 1], 4)
    assert pools.pool_counts(COUNTS, TIER_OF, 2) == ([5, 35, 1], 3)
    assert pools.pool_counts(COUNTS, TIER_OF, 3) == ([0, 30, 0], 1)
    with pytest.raises(ValueError, match="tier 4"):
        pools.pool_counts(COUNTS, TIER_OF, 4)


def test_thin_classes_and_their_share_of_the_test_set():
    pools = load_benchmark("tier_pools")
    # 1 of 51 samples is 1.96%: thin at 5%, not at 1%
    assert pools.thin_classes([15, 35, 1], 0.05) == [2]
    assert pools.thin_classes([15, 35, 1], 0.01) == []
    assert pools.thin_classes([0, 30, 0], 0.01) == [0, 2]
    assert pools.test_share([50, 30, 20], [0, 2]) == pytest.approx(0.7)
    assert pools.test_share([50, 30, 20], []) == 0.0


def test_rows_carry_each_methods_accuracy_beside_the_pool():
    pools = load_benchmark("tier_pools")
    case = {
        "seed": 0,
        "alpha": 0.1,
        "tier-of-partition": {str(p): t for p, t in TIER_OF.items()},
        "fedoras": {
            "models": [{"tier": t, "global-test-accuracy": 0.5 + t / 10} for t in (1, 2, 3)]
        },
        "heterofl": {"tiers": [{"tier": t, "global_test_accuracy": 0.9} for t in (1, 2, 3)]},
        "fjord": {"tiers": [{"tier": t, "global_test_accuracy": 0.95} for t in (1, 2, 3)]},
    }
    rows = pools.rows_of(case, COUNTS, [50, 30, 20], 0.05)
    assert [(r["tier"], r["clients"], r["samples"]) for r in rows] == [
        (1, 4, 51),
        (2, 3, 41),
        (3, 1, 30),
    ]
    assert [r["thin_classes"] for r in rows] == [[2], [2], [0, 2]]
    assert [r["thin_test_share"] for r in rows] == pytest.approx([0.2, 0.2, 0.7])
    assert rows[2]["rarest"] == [0, 2] and rows[2]["rarest_counts"] == [0, 0]
    assert [r["fedoras"] for r in rows] == pytest.approx([0.6, 0.7, 0.8])
    assert [r["rand_init"] for r in rows] == [None, None, None]
    assert rows[0]["fjord"] == 0.95 and rows[0]["heterofl"] == 0.9


def test_a_cases_split_is_rebuilt_from_mnist_5k(tmp_path):
    pools = load_benchmark("tier_pools")
    counts, test = pools.case_counts(
        {"seed": 0, "alpha": 0.1}, 8, tmp_path / "cache", {"data.partitioner": "dirichlet"}
    )
    assert sorted(counts) == list(range(8))
    assert all(len(c) == 10 for c in counts.values()) and len(test) == 10
    assert sum(test) == 450  # MNIST-5k's global test set
    # Dirichlet 0.1: most of a client's samples in a few classes
    shares = [max(c) / sum(c) for c in counts.values()]
    assert sum(s > 0.5 for s in shares) >= 4
