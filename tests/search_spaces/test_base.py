"""SearchSpace machinery on a toy space whose costs are computed by hand."""

import itertools

import numpy as np
import pytest
import torch
from torch import nn

from fedorasflwr.search_spaces import (
    SPACES,
    Cost,
    LayerChoice,
    MixedOp,
    SearchSpace,
    build_space,
)
from fedorasflwr.search_spaces.sampling import min_subspace_size, sample_subspace


class ToyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fixed = nn.Linear(4, 4)  # 2*4*4 = 32 FLOPs, 20 params
        self.a = MixedOp({"wide": nn.Linear(4, 4), "identity": nn.Identity()})
        self.b = MixedOp(
            {
                # 32 FLOPs, 16 + 8 params, 16 + 4 + 4 + 4 + 4 + 1 elements (BN buffers)
                "lin.bn": nn.Sequential(nn.Linear(4, 4, bias=False), nn.BatchNorm1d(4)),
                # 2*4*8 + 2*8*4 = 128 FLOPs, 40 + 36 params
                "stack": nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 4)),
            }
        )

    def forward(self, x, arch):
        return self.b(self.a(self.fixed(x), arch[0]), arch[1])


class ToySpace(SearchSpace):
    name = "toy"

    def __init__(self) -> None:
        super().__init__(ToyNet(), input_shape=(4,), input_dtype=torch.float32, spec={})


@pytest.fixture(scope="module")
def toy():
    return ToySpace()


def test_choices_are_labelled_in_forward_order(toy):
    assert toy.choices == (
        LayerChoice("a", ("wide", "identity")),
        LayerChoice("b", ("lin.bn", "stack")),
    )
    assert toy.num_options() == (2, 2)
    assert toy.spec == {"name": "tests.search_spaces.test_base:ToySpace"}


def test_costs_match_hand_computed_values(toy):
    assert toy.fixed_cost == Cost(32, 20)
    assert [toy.option_cost(0, o) for o in range(2)] == [Cost(32, 20), Cost(0, 0)]
    assert [toy.option_cost(1, o) for o in range(2)] == [Cost(32, 24), Cost(128, 76)]
    assert toy.cost((1, 1)) == Cost(32 + 128, 20 + 76)
    assert toy.min_flops() == 64 and toy.max_flops() == 192
    assert toy.min_flops(((0,), (1,))) == 192


def test_sizes_count_buffers(toy):
    assert [toy.option_size(1, o) for o in range(2)] == [33, 76]
    assert toy.option_size(0, 1) == 0
    assert toy.fixed_size == 20
    assert toy.total_size == 20 + 20 + 33 + 76


def test_keys_use_module_safe_option_names(toy):
    assert toy.op_keys(0, 1) == ()
    assert toy.op_keys(1, 0) == (
        "net.b.ops.lin_bn.0.weight",
        "net.b.ops.lin_bn.1.weight",
        "net.b.ops.lin_bn.1.bias",
        "net.b.ops.lin_bn.1.running_mean",
        "net.b.ops.lin_bn.1.running_var",
        "net.b.ops.lin_bn.1.num_batches_tracked",
    )
    assert toy.fixed_keys() == ("net.fixed.weight", "net.fixed.bias")
    assert toy.path_keys((1, 1)) == (
        "net.fixed.weight",
        "net.fixed.bias",
        "net.b.ops.stack.0.weight",
        "net.b.ops.stack.0.bias",
        "net.b.ops.stack.1.weight",
        "net.b.ops.stack.1.bias",
    )
    assert toy.subspace_keys(((1,), (0, 1))) == toy.fixed_keys() + toy.op_keys(1, 0) + (
        toy.op_keys(1, 1)
    )


def test_greedy_sampling_follows_eq3_by_hand(toy):
    # Budget 170: layer b has no zero-FLOPs option, so it is visited first and
    # picks uniformly from {lin.bn (64 total), stack (160)}; after stack only
    # identity fits in layer a, after lin.bn both do.
    rng = np.random.default_rng(0)
    counts = {}
    for _ in range(10_000):
        path = toy.sample_path(rng, max_flops=170)
        counts[path] = counts.get(path, 0) + 1
    assert set(counts) == {(0, 0), (1, 0), (1, 1)}
    assert counts[(1, 1)] / 10_000 == pytest.approx(0.5, abs=0.03)
    assert counts[(0, 0)] / 10_000 == pytest.approx(0.25, abs=0.03)


def test_sample_subspace_by_hand(toy):
    # Budget 100 and max_flops 100: lin.bn must stay (the stack path costs
    # 160), so stack always goes; removing the wide op alone is not enough.
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(200):
        sub = toy.sample_subspace(rng, max_size=100, max_flops=100)
        assert 1 in sub[0] and 0 in sub[1] and 1 not in sub[1]
        seen.add(sub)
    assert seen == {((0, 1), (0,)), ((1,), (0,))}
    assert toy.min_subspace_size() == 20 + 33
    with pytest.raises(ValueError, match="smallest reachable subspace size 53"):
        toy.sample_subspace(rng, max_size=52)


def test_sample_subspace_never_dead_ends():
    # Layer 0 has no non-parametric option: removing its small option first
    # would leave the big one and no way to reach the budget.
    flops, sizes = [[1, 1]], [[10, 100]]
    for seed in range(50):
        sub = sample_subspace(np.random.default_rng(seed), flops, sizes, 0, 5, 20, None)
        assert sub == ((0,),)


def _brute_force_min_size(flops, sizes, fixed_flops, fixed_size, max_flops):
    best = None
    per_layer = [
        [
            s
            for r in range(1, len(f) + 1)
            for s in itertools.combinations(range(len(f)), r)
            if all(o in s for o in range(len(f)) if sz[o] == 0)
        ]
        for f, sz in zip(flops, sizes, strict=True)
    ]
    for choice in itertools.product(*per_layer):
        cheapest = fixed_flops + sum(
            min(f[o] for o in s) for f, s in zip(flops, choice, strict=True)
        )
        if cheapest <= max_flops:
            size = fixed_size + sum(
                sum(sz[o] for o in s) for sz, s in zip(sizes, choice, strict=True)
            )
            best = size if best is None else min(best, size)
    return best


def test_min_subspace_size_matches_brute_force():
    rng = np.random.default_rng(3)
    for _ in range(40):
        flops = [rng.integers(0, 20, size=rng.integers(1, 4)).tolist() for _ in range(3)]
        sizes = [[int(f > 0) * int(rng.integers(1, 30)) for f in layer] for layer in flops]
        budget = float(rng.integers(5, 60))
        expected = _brute_force_min_size(flops, sizes, 3, 7, budget)
        if expected is None:
            with pytest.raises(ValueError):
                min_subspace_size(flops, sizes, 3, 7, budget)
        else:
            assert min_subspace_size(flops, sizes, 3, 7, budget) == expected


def test_validation_errors_name_the_layer_and_valid_range(toy):
    with pytest.raises(ValueError, match=r"layer 1 \('b'\): option 2 out of range 0..1"):
        toy.validate_arch((0, 2))
    with pytest.raises(ValueError, match="0=lin.bn, 1=stack"):
        toy.validate_arch((0, -1))
    with pytest.raises(ValueError, match="needs 2 option indices"):
        toy.validate_arch((0,))
    with pytest.raises(ValueError, match="must be an int"):
        toy.validate_arch((0, 0.5))
    with pytest.raises(ValueError, match="no option 'conv'"):
        toy.arch_from_names(["wide", "conv"])
    with pytest.raises(ValueError, match="keeps no option in layer 0"):
        toy.validate_subspace(((), (0,)))
    with pytest.raises(ValueError, match="out of range"):
        toy.op_keys(1, 5)
    assert toy.validate_arch(np.array([1, 0])) == (1, 0)
    assert toy.arch_from_names(toy.option_names((1, 0))) == (1, 0)


def test_mask_round_trip_and_errors(toy):
    sub = ((1,), (0, 1))
    assert toy.subspace_mask(sub) == [0, 1, 1, 1]
    assert toy.subspace_from_mask([0, 1, 1, 1]) == sub
    assert toy.subspace_from_mask(toy.subspace_mask(toy.full_subspace())) == toy.full_subspace()
    with pytest.raises(ValueError, match="needs 4 entries"):
        toy.subspace_from_mask([1, 1, 1])
    with pytest.raises(ValueError, match="keeps no option in layer 1"):
        toy.subspace_from_mask([1, 1, 0, 0])
    with pytest.raises(ValueError, match="0 or 1"):
        toy.subspace_from_mask([1, 2, 1, 1])


def test_build_space_rejects_bad_names_and_arguments():
    assert {"cnn_l", "cnn_s", "rnn"} <= set(SPACES)
    with pytest.raises(ValueError, match="unknown search space 'resnet'; valid: .*cnn_l"):
        build_space("resnet")
    with pytest.raises(ValueError, match=r"unknown argument\(s\) \['depth'\]; valid: .*width"):
        build_space("cnn_s", depth=3)
    with pytest.raises(ValueError, match="width must be a number > 0"):
        build_space("rnn", width=0)
    with pytest.raises(ValueError, match="num_classes must be an integer >= 1"):
        build_space("cnn_l", num_classes=2.5)


def test_option_names_must_not_shadow_module_attributes():
    with pytest.raises(ValueError, match="clash with nn.Module attributes"):
        MixedOp({"double": nn.Identity(), "identity": nn.Identity()})


def test_forward_has_no_hidden_path_state(toy):
    toy.eval()
    x = torch.randn(5, 4)
    first = toy(x, (0, 1))
    toy(x, (1, 0))
    torch.testing.assert_close(toy(x, (0, 1)), first)


def test_an_unregistered_space_is_rebuilt_from_its_import_path(toy):
    from fedorasflwr.search_spaces import build_space

    rebuilt = build_space(**toy.spec)
    assert type(rebuilt) is ToySpace and rebuilt.spec == toy.spec
    assert (
        build_space("cnn_s", num_classes=10).spec["name"] == "cnn_s"
    )  # built-ins keep short names


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("nope", "unknown search space 'nope'"),
        ("no_such_module_xyz:Space", "cannot import module 'no_such_module_xyz'"),
        ("tests.search_spaces.test_base:Missing", "has no 'Missing'"),
        ("tests.search_spaces.test_base:ToyNet", "is not a subclass of"),
        ("tests.search_spaces.test_base:f.<locals>.S", "defined inside a function"),
        (":ToySpace", "not an import path"),
    ],
)
def test_a_bad_space_path_is_refused_with_what_went_wrong(name, message):
    from fedorasflwr.search_spaces import build_space

    with pytest.raises(ValueError, match=message):
        build_space(name)


def test_a_path_from_a_message_cannot_make_a_node_import_a_new_package():
    # the space's path arrives in a message: a package this process never loaded (here one
    # that exists and would run code on import) is refused, and stays unimported
    import sys

    from fedorasflwr.search_spaces import build_space

    assert "antigravity" not in sys.modules
    with pytest.raises(ValueError, match="package 'antigravity' is not loaded by this process"):
        build_space("antigravity:Space")
    assert "antigravity" not in sys.modules
