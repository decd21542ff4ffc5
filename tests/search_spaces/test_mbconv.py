"""The ``mbconv`` space: options, alphas as state, expected FLOPs, derivation, gated forward."""

from __future__ import annotations

import itertools

import pytest
import torch

from fedorasflwr.search_spaces import build_space
from fedorasflwr.search_spaces.mbconv import MBCONV_OPTIONS, MBConvSpace


@pytest.fixture(scope="module")
def space() -> MBConvSpace:
    torch.manual_seed(0)
    return build_space("mbconv", width=0.25, layers_per_stage=2)


def test_options_identity_only_where_shapes_allow(space):
    assert len(space.choices) == 6
    for layer, choice in enumerate(space.choices):
        assert choice.options[:6] == MBCONV_OPTIONS
        # a stage's first layer changes the shape: no identity there
        assert ("identity" in choice.options) == (layer % 2 == 1)


def test_alphas_are_parameters_in_the_state_dict(space):
    state = space.state_dict()
    for key, choice in zip(space.alpha_keys(), space.choices, strict=True):
        assert key in state and key in space.fixed_keys()
        assert state[key].shape == (len(choice.options),)
    assert {id(p) for p in space.arch_parameters()}.isdisjoint(
        id(p) for p in space.weight_parameters()
    )


def test_derivation_picks_the_argmax(space):
    picks = []
    with torch.no_grad():
        for layer, alpha in enumerate(space.arch_parameters()):
            pick = (3 * layer + 1) % len(alpha)
            alpha.copy_(torch.linspace(-1, 1, len(alpha)).roll(pick + 1))
            assert int(alpha.argmax()) == pick
            picks.append(pick)
    assert space.derive() == tuple(picks)


def test_derivation_under_a_flops_bound_is_the_most_probable_path_that_fits():
    torch.manual_seed(1)
    space = build_space("mbconv", width=0.25, layers_per_stage=2)
    with torch.no_grad():
        for alpha in space.arch_parameters():
            alpha.copy_(torch.randn(len(alpha)))
    argmax = space.derive()
    assert space.derive(space.cost(argmax).flops) == argmax  # the argmax fits: unchanged
    logp = [torch.log_softmax(a.detach().double(), 0).tolist() for a in space.arch_parameters()]
    flops = [[space.option_cost(i, o).flops for o in range(len(p))] for i, p in enumerate(logp)]
    paths = list(itertools.product(*(range(len(p)) for p in logp)))
    for share in (0.9, 0.6, 0.35):
        bound = space.min_flops() + share * (space.cost(argmax).flops - space.min_flops())
        budget = bound - space.fixed_cost.flops
        fits = [p for p in paths if sum(flops[i][o] for i, o in enumerate(p)) <= budget]
        best = max(fits, key=lambda p: sum(logp[i][o] for i, o in enumerate(p)))
        derived = space.derive(bound)
        assert space.cost(derived).flops <= bound < space.cost(argmax).flops
        assert sum(logp[i][o] for i, o in enumerate(derived)) == pytest.approx(
            sum(logp[i][o] for i, o in enumerate(best)), abs=1e-12
        )
    assert space.cost(space.derive(space.min_flops())).flops == space.min_flops()
    with pytest.raises(ValueError, match="no path of the 'mbconv' space fits"):
        space.derive(space.min_flops() - 1)


def test_expected_flops_is_the_probability_weighted_cost(space):
    with torch.no_grad():
        for alpha in space.arch_parameters():
            alpha.zero_()
    uniform = space.fixed_cost.flops + sum(
        sum(space.option_cost(layer, o).flops for o in range(n)) / n
        for layer, n in enumerate(space.num_options())
    )
    assert float(space.expected_flops().detach()) == pytest.approx(uniform, rel=1e-6)
    with torch.no_grad():
        for alpha in space.arch_parameters():
            alpha.fill_(-30.0)
            alpha[0] = 30.0  # all mass on option 0
    path = (0,) * len(space.choices)
    assert float(space.expected_flops().detach()) == pytest.approx(space.cost(path).flops, rel=1e-4)


def test_gated_forward_with_one_active_gate_is_the_path(space):
    space.eval()
    x = torch.randn(2, 1, 28, 28)
    arch = tuple(n - 1 if layer % 2 else 2 for layer, n in enumerate(space.num_options()))
    candidates = [(option, 0) for option in arch]
    gates = [torch.tensor([1.0, 0.0]) for _ in arch]
    with torch.no_grad():
        torch.testing.assert_close(space.forward_gated(x, candidates, gates), space(x, arch))


def test_subnet_runs_the_path_and_has_its_parameter_count(space):
    arch = (1, 6, 2, 0, 5, 3)
    subnet = space.subnet(arch).eval()
    space.eval()
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(subnet(x), space(x, arch))
    # the count includes the (unused) alphas the subnet carries: one logit per option
    assert sum(p.numel() for p in subnet.parameters()) == space.cost(arch).params
