"""The darts space: shapes, alphas as parameters, GroupNorm only, genotype, derived net."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedorasflwr.search_spaces import build_space
from fedorasflwr.search_spaces.darts import (
    PRIMITIVES,
    DartsSpace,
    DerivedNetwork,
    Genotype,
    derive_genotype,
)


@pytest.fixture(scope="module")
def space() -> DartsSpace:
    torch.manual_seed(0)
    return build_space("darts", channels=2, cells=3, input_height=16, input_width=16)


def test_cells_edges_and_options(space):
    assert len(space.choices) == 3 * 14
    assert all(choice.options == PRIMITIVES for choice in space.choices)
    assert [cell.reduction for cell in space.net.cells] == [False, True, True]


def test_alphas_are_parameters_and_no_batchnorm(space):
    names = dict(space.named_parameters())
    assert set(DartsSpace.ARCH_KEYS) <= set(names)
    assert names["net.alpha_normal"].shape == (14, 8)
    assert set(space.weight_keys()) | set(DartsSpace.ARCH_KEYS) == set(space.state_dict())
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in space.modules())
    assert any(isinstance(m, nn.GroupNorm) for m in space.modules())


def test_mixed_and_path_forward(space):
    x = torch.randn(3, 1, 16, 16)
    assert space(x).shape == (3, 10)
    assert space(x, (4,) * len(space.choices)).shape == (3, 10)
    space(x).sum().backward()
    assert space.net.alpha_reduce.grad is not None


def test_genotype_keeps_top_two_non_zero_inputs():
    alpha = torch.zeros(14, 8)
    # node 0 (edges 0, 1), node 1 (edges 2-4): make 'none' the largest everywhere
    alpha[:, PRIMITIVES.index("none")] = 10.0
    alpha[0, PRIMITIVES.index("sep_conv_3x3")] = 5.0
    alpha[1, PRIMITIVES.index("max_pool_3x3")] = 4.0
    alpha[4, PRIMITIVES.index("dil_conv_5x5")] = 6.0
    alpha[3, PRIMITIVES.index("skip_connect")] = 3.0
    genotype = derive_genotype(alpha, alpha)
    assert genotype.normal[:2] == (("sep_conv_3x3", 0), ("max_pool_3x3", 1))
    assert genotype.normal[2:4] == (("skip_connect", 1), ("dil_conv_5x5", 2))
    assert all(op != "none" for op, _ in genotype.normal + genotype.reduce)
    assert Genotype.from_text(genotype.to_text()) == genotype
    with pytest.raises(ValueError, match="bad pair"):
        Genotype.from_text(genotype.to_text().replace("sep_conv_3x3:0", "none:0", 1))


def test_derived_network_trains_on_its_own(space):
    spec = {k: v for k, v in space.spec.items() if k != "name"}
    net = DerivedNetwork(space.genotype(), **spec)
    assert not any("alpha" in k for k in net.state_dict())
    torch.manual_seed(0)
    x, y = torch.randn(16, 1, 16, 16), torch.randint(0, 10, (16,))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    losses = []
    for _ in range(15):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(net(x), y)
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    assert losses[-1] < losses[0]
