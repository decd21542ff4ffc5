"""The concrete spaces: costs against FlopCounterMode, keys, subnets, rebuilds."""

import time

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from fedorasflwr.search_spaces import SearchSpace, build_space, build_subnet

TINY = {
    "cnn_l": {
        "num_classes": 10,
        "in_channels": 3,
        "input_height": 16,
        "input_width": 16,
        "width": 0.125,
    },
    "cnn_s": {
        "num_classes": 10,
        "in_channels": 1,
        "input_height": 28,
        "input_width": 28,
        "width": 0.25,
    },
    "rnn": {"vocab_size": 20, "seq_len": 7, "width": 0.125},
}


@pytest.fixture(scope="module", params=sorted(TINY))
def space(request) -> SearchSpace:
    torch.manual_seed(0)
    return build_space(request.param, **TINY[request.param]).eval()


def _inputs(space: SearchSpace, batch: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    if space.input_dtype == torch.int64:
        return torch.randint(
            0, space.spec["vocab_size"], (batch, *space.input_shape), generator=generator
        )
    return torch.randn((batch, *space.input_shape), generator=generator)


def _flops(module: torch.nn.Module, x: torch.Tensor) -> int:
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        module(x)
    return counter.get_total_flops()


def _archs(space: SearchSpace, count: int) -> list[tuple[int, ...]]:
    rng = np.random.default_rng(0)
    extremes = [tuple(0 for _ in space.choices), tuple(n - 1 for n in space.num_options())]
    return extremes + [space.sample_path(rng) for _ in range(count)]


def test_cost_equals_flop_counter_and_params_of_the_subnet(space):
    x = _inputs(space, 1)
    for arch in _archs(space, 25):
        sub = space.subnet(arch)
        cost = space.cost(arch)
        assert cost.flops == _flops(sub, x), space.option_names(arch)
        assert cost.params == sum(p.numel() for p in sub.parameters())
        options = [space.option_cost(layer, o) for layer, o in enumerate(arch)]
        assert cost.flops == space.fixed_cost.flops + sum(c.flops for c in options)


def test_min_and_max_flops_are_attained(space):
    cheapest = tuple(
        int(np.argmin([space.option_cost(layer, o).flops for o in range(n)]))
        for layer, n in enumerate(space.num_options())
    )
    dearest = tuple(
        int(np.argmax([space.option_cost(layer, o).flops for o in range(n)]))
        for layer, n in enumerate(space.num_options())
    )
    assert space.cost(cheapest).flops == space.min_flops()
    assert space.cost(dearest).flops == space.max_flops()
    assert space.fixed_cost.flops <= space.min_flops() < space.max_flops()


def test_keys_partition_the_state_dict(space):
    state = space.state_dict()
    op_keys = [
        k
        for layer, n in enumerate(space.num_options())
        for o in range(n)
        for k in space.op_keys(layer, o)
    ]
    assert len(op_keys) == len(set(op_keys))
    assert not set(op_keys) & set(space.fixed_keys())
    assert set(op_keys) | set(space.fixed_keys()) == set(state)
    sizes = sum(
        space.option_size(layer, o) for layer, n in enumerate(space.num_options()) for o in range(n)
    )
    assert space.fixed_size + sizes == space.total_size == sum(v.numel() for v in state.values())
    assert space.subspace_keys(space.full_subspace()) == tuple(state)
    for layer, n in enumerate(space.num_options()):
        for option in range(n):
            parametric = space.option_cost(layer, option).params > 0
            assert bool(space.op_keys(layer, option)) == parametric


def test_subnet_matches_the_supernet_and_owns_copies(space):
    x = _inputs(space, 3)
    for arch in _archs(space, 8):
        sub = space.subnet(arch).eval()
        assert tuple(sub.state_dict()) == space.path_keys(arch)
        torch.testing.assert_close(sub(x), space(x, arch), atol=1e-6, rtol=0)
        sub_state, state = sub.state_dict(), space.state_dict()
        for key, value in sub_state.items():
            assert value.data_ptr() != state[key].data_ptr()


def test_subnet_weights_load_back_into_the_supernet():
    space = build_space("cnn_s", **TINY["cnn_s"])
    arch = space.sample_path(np.random.default_rng(2))
    sub = space.subnet(arch)
    with torch.no_grad():
        for p in sub.parameters():
            p.add_(1.0)
    before = {k: v.clone() for k, v in space.state_dict().items()}
    result = space.load_state_dict(sub.state_dict(), strict=False)
    assert not result.unexpected_keys
    after = space.state_dict()
    changed = {k for k in after if not torch.equal(after[k], before[k])}
    params = {n for n, _ in space.named_parameters()}
    assert changed == set(space.path_keys(arch)) & params


def test_spec_rebuilds_the_same_structure(space):
    spec = space.spec
    assert spec["name"] == space.name
    assert all(isinstance(v, int | float | str) for v in spec.values())
    rebuilt = build_space(**spec)
    assert rebuilt.choices == space.choices
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == {
        k: v.shape for k, v in space.state_dict().items()
    }
    assert rebuilt.fixed_cost == space.fixed_cost
    assert rebuilt.max_flops() == space.max_flops()


def test_subnet_can_be_rebuilt_from_its_spec(space):
    arch = _archs(space, 1)[-1]
    sub = space.subnet(arch)
    clone = build_space(**sub.spec).subnet(sub.arch).eval()
    clone.load_state_dict(sub.state_dict())
    x = _inputs(space, 2)
    torch.testing.assert_close(clone(x), sub.eval()(x))


def test_output_shapes(space):
    x = _inputs(space, 2)
    out = space(x, _archs(space, 0)[0])
    if space.name == "rnn":
        assert out.shape == (2, space.spec["seq_len"], space.spec["vocab_size"])
    else:
        assert out.shape == (2, space.spec["num_classes"])


def test_rnn_is_causal_and_counts_recurrent_matmuls():
    space = build_space("rnn", **TINY["rnn"]).eval()
    x = _inputs(space, 2)
    changed = x.clone()
    changed[:, 4:] = (changed[:, 4:] + 1) % space.spec["vocab_size"]
    rng = np.random.default_rng(0)
    for _ in range(10):
        arch = space.sample_path(rng)
        torch.testing.assert_close(space(x, arch)[:, :4], space(changed, arch)[:, :4])
    # FlopCounterMode sees 0 FLOPs in nn.LSTM on CPU; ours counts every matmul.
    hidden, embed, steps = space.hidden_size, space.spec["embed_dim"], space.spec["seq_len"]
    lstm = space.choices[0].options.index("lstm")
    assert space.option_cost(0, lstm).flops == 2 * steps * 4 * hidden * (embed + hidden)
    gru = space.choices[2].options.index("gru")
    assert space.option_cost(2, gru).flops == 2 * steps * 3 * hidden * (2 * hidden)


def test_paper_option_lists():
    cnn_l = build_space("cnn_l", **TINY["cnn_l"])
    assert len(cnn_l.choices) == 12 and set(cnn_l.num_options()) == {9}
    cnn_s = build_space("cnn_s", **TINY["cnn_s"])
    assert len(cnn_s.choices) == 4 and set(cnn_s.num_options()) == {11}
    assert {"conv3x3", "dsconv1x1_e2"} <= set(cnn_s.choices[0].options)
    rnn = build_space("rnn", **TINY["rnn"])
    assert [c.name for c in rnn.choices] == ["op1", "skip1", "op2", "skip2"]
    assert rnn.num_options() == (6, 7, 7, 8)  # 2352 paths, as the paper's Table 8


@pytest.mark.parametrize("name", sorted(TINY))
def test_width_one_eighth_builds_and_runs_fast(name):
    kwargs = {**TINY[name], "width": 0.125}
    build_space("cnn_s", width=0.125)  # FlopCounterMode's one-off start-up (~1 s) is not ours
    start = time.process_time()  # CPU time: other jobs on the machine don't count
    space = build_space(name, **kwargs)
    space(_inputs(space, 4), _archs(space, 0)[-1])
    assert time.process_time() - start < 1.0


def test_cnn_l_handles_odd_feature_maps():
    # 28 -> 14 -> 7 -> 4: the 2x2 residual of the third reduction sees a 7x7 map.
    space = build_space("cnn_l", in_channels=1, input_height=28, input_width=28, width=0.125)
    x = _inputs(space, 1)
    for arch in _archs(space, 3):
        assert space.cost(arch).flops == _flops(space.subnet(arch), x)
        assert space(x, arch).shape == (1, 10)


def test_build_subnet_copies_a_path_of_a_kept_template_that_training_leaves_alone():
    spec = build_space("cnn_s", in_channels=1, input_height=28, input_width=28, width=0.25).spec
    arch = [1] * 4
    first = build_subnet(spec, arch)
    reference = build_space(**spec).subnet(arch)
    assert first.state_dict().keys() == reference.state_dict().keys()
    assert (first.arch, first.spec) == (reference.arch, reference.spec)
    before = {k: v.clone() for k, v in build_subnet(spec, arch).state_dict().items()}
    # a client trains its copy in place: the next copy starts from the template again
    with torch.no_grad():
        for p in first.parameters():
            p.add_(1.0)
    second = build_subnet(spec, arch)
    assert second is not first
    for key, value in second.state_dict().items():
        assert torch.equal(value, before[key]), key
    # the full load every caller does makes it the sender's net, whatever the template holds
    second.load_state_dict(reference.state_dict(), strict=True)
    x = torch.randn(2, 1, 28, 28)
    torch.testing.assert_close(second.eval()(x), reference.eval()(x), rtol=0, atol=0)
