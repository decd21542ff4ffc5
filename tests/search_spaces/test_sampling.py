"""Path sampling (paper Eq. 3) and subspace sampling (paper Eq. 1) on the real spaces."""

import numpy as np
import pytest

from fedorasflwr.search_spaces import SearchSpace, build_space

TINY = {
    "cnn_l": {"input_height": 16, "input_width": 16, "width": 0.125},
    "cnn_s": {"num_classes": 10, "input_height": 28, "input_width": 28, "width": 0.25},
    "rnn": {"vocab_size": 20, "seq_len": 7, "width": 0.125},
}
BUDGET_FRACTIONS = (0.02, 0.1, 0.35, 0.7)


@pytest.fixture(scope="module", params=sorted(TINY))
def space(request) -> SearchSpace:
    return build_space(request.param, **TINY[request.param])


def _flops_table(space):
    return [
        [space.option_cost(layer, o).flops for o in range(n)]
        for layer, n in enumerate(space.num_options())
    ]


def _budgets(space):
    low, high = space.min_flops(), space.max_flops()
    return [low + f * (high - low) for f in BUDGET_FRACTIONS]


def _feasible(space, budget, subspace):
    """Options that appear in at least one path of ``subspace`` within ``budget``."""
    table = _flops_table(space)
    mins = [min(table[layer][o] for o in opts) for layer, opts in enumerate(subspace)]
    rest = space.fixed_cost.flops + sum(mins)
    return {
        (layer, o)
        for layer, opts in enumerate(subspace)
        for o in opts
        if rest - mins[layer] + table[layer][o] <= budget
    }


def _check_paths(space, rng, budget, subspace, samples=10_000):
    table = _flops_table(space)
    fixed = space.fixed_cost.flops
    seen = set()
    for _ in range(samples):
        path = space.sample_path(rng, max_flops=budget, subspace=subspace)
        assert fixed + sum(table[layer][o] for layer, o in enumerate(path)) <= budget
        seen.update(enumerate(path))
    assert seen == _feasible(space, budget, subspace)


def test_paths_stay_within_budget_and_cover_every_feasible_option(space):
    rng = np.random.default_rng(0)
    for budget in _budgets(space):
        _check_paths(space, rng, budget, space.full_subspace())


def test_paths_in_a_subspace_stay_in_it(space):
    rng = np.random.default_rng(1)
    budget = _budgets(space)[2]
    subspace = space.sample_subspace(rng, space.total_size / 2, max_flops=budget)
    _check_paths(space, rng, budget, subspace, samples=5_000)


def test_tightest_budget_yields_the_cheapest_paths(space):
    rng = np.random.default_rng(2)
    for _ in range(100):
        assert space.cost(space.sample_path(rng, space.min_flops())).flops == space.min_flops()


def test_unbounded_paths_are_uniform_per_layer(space):
    rng = np.random.default_rng(3)
    paths = np.array([space.sample_path(rng) for _ in range(6_000)])
    for layer, n in enumerate(space.num_options()):
        frequencies = np.bincount(paths[:, layer], minlength=n) / len(paths)
        assert np.allclose(frequencies, 1 / n, atol=0.03)


def test_budget_below_the_cheapest_path_is_rejected(space):
    low = space.min_flops()
    with pytest.raises(
        ValueError, match=f"max_flops={low - 1:g} is below the cheapest path \\({low} FLOPs"
    ):
        space.sample_path(np.random.default_rng(0), max_flops=low - 1)
    with pytest.raises(ValueError, match="below the cheapest path"):
        space.sample_subspace(np.random.default_rng(0), space.total_size, max_flops=low - 1)


def test_same_seed_same_samples(space):
    def draw(seed):
        rng = np.random.default_rng(seed)
        paths = [space.sample_path(rng, _budgets(space)[1]) for _ in range(50)]
        subspaces = [space.sample_subspace(rng, space.total_size / 2) for _ in range(5)]
        return paths, subspaces

    assert draw(7) == draw(7)
    assert draw(7) != draw(8)


@pytest.mark.parametrize("budget_index", [None, 0, 2])
def test_subspaces_fit_the_size_and_keep_a_path_within_budget(space, budget_index):
    rng = np.random.default_rng(4)
    max_flops = None if budget_index is None else _budgets(space)[budget_index]
    smallest = space.min_subspace_size(max_flops)
    sizes = space.state_dict()
    for max_size in (space.total_size / 2, space.total_size / 4, smallest):
        for _ in range(20):
            sub = space.sample_subspace(rng, max_size, max_flops=max_flops)
            assert sub == space.validate_subspace(sub)
            size = sum(sizes[k].numel() for k in space.subspace_keys(sub))
            assert size == space.subspace_size(sub) <= max_size
            for layer, n in enumerate(space.num_options()):
                assert sub[layer]
                for option in range(n):
                    if space.option_size(layer, option) == 0:
                        assert option in sub[layer]
            if max_flops is not None:
                assert space.min_flops(sub) <= max_flops
                path = space.sample_path(rng, max_flops, sub)
                assert all(o in sub[layer] for layer, o in enumerate(path))


def test_subspace_removal_is_uniform_enough_to_cover_everything(space):
    rng = np.random.default_rng(5)
    kept = np.zeros(sum(space.num_options()))
    for _ in range(300):
        kept += space.subspace_mask(space.sample_subspace(rng, space.total_size / 2))
    # Every option is sometimes sent and every parametric one sometimes left out.
    parametric = np.array(
        [
            space.option_size(layer, o) > 0
            for layer, n in enumerate(space.num_options())
            for o in range(n)
        ]
    )
    assert np.all(kept > 0)
    assert np.all(kept[parametric] < 300)


def test_unreachable_size_is_rejected_with_the_smallest_size(space):
    smallest = space.min_subspace_size()
    with pytest.raises(ValueError, match=f"smallest reachable subspace size {smallest}"):
        space.sample_subspace(np.random.default_rng(0), smallest - 1)
