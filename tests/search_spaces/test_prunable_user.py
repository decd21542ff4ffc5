"""A user's own nn.Module pruned by DecNAS's generic path (torch-pruning's dependency graph):
a residual branch, a concatenation and linear layers; costs against a hand count, the
largest-norm filters kept through the coupled layers, rebuilt from its import path."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from fedorasflwr.search_spaces.prunable import (
    build_prunable,
    filter_norms,
    load_prunable,
    prune_layer,
    prune_to_budget,
    resource,
)

SHAPE = (1, 4, 4)


class TinyResNet(nn.Module):
    """A 3x3 stem, a 1x1 conv added back onto it (residual), two 1x1 branches concatenated,
    a 1x1 mix, global average pooling, a hidden linear layer and the classifier."""

    def __init__(
        self,
        num_classes: int = 3,
        in_channels: int = 1,
        stem: int = 2,
        branches: tuple[int, int] = (3, 2),
        mix: int = 4,
        hidden: int = 6,
    ) -> None:
        super().__init__()
        self.stem = nn.Conv2d(in_channels, stem, 3, padding=1, bias=False)
        self.stem_bn = nn.BatchNorm2d(stem)
        self.res = nn.Conv2d(stem, stem, 1, bias=False)
        self.res_bn = nn.BatchNorm2d(stem)
        self.left = nn.Conv2d(stem, branches[0], 1, bias=False)
        self.right = nn.Conv2d(stem, branches[1], 1, bias=False)
        self.mix = nn.Conv2d(sum(branches), mix, 1, bias=False)
        self.hidden = nn.Linear(mix, hidden)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = torch.relu(self.stem_bn(self.stem(x)))
        x = torch.relu(x + self.res_bn(self.res(x)))
        x = torch.relu(self.mix(torch.cat([self.left(x), self.right(x)], dim=1)))
        x = torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1)
        return self.head(torch.relu(self.hidden(x)))


class OnlyHead(nn.Module):
    """Nothing to prune: the one linear layer is the classifier."""

    def __init__(self, num_classes: int = 3) -> None:
        super().__init__()
        self.head = nn.Linear(16, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.flatten(x, 1))


class LooseScale(nn.Module):
    """A per-channel scale held as a bare parameter, outside any conv/linear/norm layer."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.scale = nn.Parameter(torch.ones(4, 1, 1))
        self.head = nn.Linear(4, 3)

    def forward(self, x: Tensor) -> Tensor:
        x = (self.conv(x) * self.scale).mean(dim=(2, 3))
        return self.head(x)


def tiny(**kwargs):
    torch.manual_seed(0)
    return build_prunable(TinyResNet, input_shape=SHAPE, **kwargs).eval()


def test_layers_are_found_through_the_residual_and_the_concatenation():
    net = tiny()
    # the stem and the residual conv share their channels (added): one layer, two filter sets
    assert net.layer_names() == ("stem", "left", "right", "mix", "hidden")
    assert net.layout.filters[0] == ("stem", "res")
    assert net.widths == (2, 3, 2, 4, 6)  # the classifier (head) is not prunable
    assert net.spec == {
        "name": "tests.search_spaces.test_prunable_user:TinyResNet",
        "input_shape": [1, 4, 4],
        "widths": [2, 3, 2, 4, 6],
    }


def test_costs_match_a_hand_count():
    net = tiny()
    # MACs on 4x4 (16 px): stem 1x2x9, res 2x2, left 2x3, right 2x2, mix 5x4 per pixel;
    # hidden 4x6, head 6x3 (BN, biases, pooling and the add are not counted)
    macs = (18 + 4 + 6 + 4 + 20) * 16 + 24 + 18
    params = 18 + 4 + 4 + 4 + 6 + 4 + 20 + (24 + 6) + (18 + 3)  # convs, 2 BNs x 2, linears
    assert (macs, params) == (874, 111)
    assert resource(net, "macs") == macs and resource(net, "params") == params
    # one filter less in each layer, by hand:
    saved = {
        0: (9 * 16 + 3 * 16 + 3 * 16 + 2 * 16, 9 + 2 + 3 + 2 + 3 + 2),  # stem, res in+out, BNs
        1: (2 * 16 + 4 * 16, 2 + 4),  # left's filter, mix's input channel
        2: (2 * 16 + 4 * 16, 2 + 4),
        3: (5 * 16 + 6, 5 + 6),  # mix's filter, hidden's input column
        4: (4 + 3, 4 + 1 + 3),  # hidden's row and bias, head's column
    }
    for layer, (macs_saved, params_saved) in saved.items():
        pruned = prune_layer(net, layer, net.widths[layer] - 1)
        assert resource(pruned, "macs") == macs - macs_saved, layer
        assert resource(pruned, "params") == params - params_saved, layer
        assert pruned(torch.randn(2, *SHAPE)).shape == (2, 3)


def test_the_coupled_residual_filters_are_ranked_together_and_sliced_everywhere():
    net = tiny()
    state = net.state_dict()
    stem = torch.stack([torch.full((1, 3, 3), 1.0), torch.full((1, 3, 3), 0.5)])
    res = torch.tensor([[0.0, 0.0], [4.0, 0.0]]).view(2, 2, 1, 1)
    state["model.stem.weight"], state["model.res.weight"] = stem, res
    net.load_state_dict(state)
    # the stem alone would keep filter 0 (norm 3 > 1.5); with the residual's, filter 1 wins
    assert filter_norms(net, 0).tolist() == pytest.approx([3.0, (1.5**2 + 16) ** 0.5])
    after = prune_layer(net, 0, 1).state_dict()
    assert torch.equal(after["model.stem.weight"], stem[[1]])
    assert torch.equal(after["model.res.weight"], res[[1]][:, [1]])
    assert torch.equal(
        after["model.stem_bn.running_mean"], state["model.stem_bn.running_mean"][[1]]
    )
    assert torch.equal(after["model.left.weight"], state["model.left.weight"][:, [1]])
    assert torch.equal(after["model.right.weight"], state["model.right.weight"][:, [1]])


def test_a_concatenated_branch_slices_its_columns_of_the_consumer():
    net = tiny()
    state = net.state_dict()
    right = torch.tensor([[0.1, 0.1], [1.0, 1.0]]).view(2, 2, 1, 1)
    state["model.right.weight"] = right
    net.load_state_dict(state)
    pruned = prune_layer(net, 2, 1)
    after = pruned.state_dict()
    assert torch.equal(after["model.right.weight"], right[[1]])
    # mix's inputs: left's 3 channels, then right's 2; right's filter 0 is column 3
    assert torch.equal(after["model.mix.weight"], state["model.mix.weight"][:, [0, 1, 2, 4]])
    x = torch.randn(3, *SHAPE)
    silenced = tiny()
    silent = dict(
        state, **{"model.right.weight": right * torch.tensor([0.0, 1.0]).view(2, 1, 1, 1)}
    )
    silenced.load_state_dict(silent)
    assert torch.allclose(prune_layer(silenced, 2, 1)(x), silenced(x), atol=1e-6)


def test_rebuilt_from_the_spec_by_import_path():
    net = tiny(num_classes=5, branches=[4, 2])
    pruned = prune_to_budget(net, 1, resource(net, "macs") - 100, "macs")
    assert pruned.widths == (2, 2, 2, 4, 6)  # left: 6 x 16 MACs per filter, 2 go
    assert pruned.spec["branches"] == [4, 2] and pruned.spec["num_classes"] == 5
    rebuilt = build_prunable(**pruned.spec)
    shapes = {k: v.shape for k, v in pruned.state_dict().items()}
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == shapes
    loaded = load_prunable(pruned.spec, pruned.state_dict()).eval()
    x = torch.randn(2, *SHAPE)
    assert torch.equal(loaded(x), pruned(x))
    assert "meta" not in {t.device.type for t in loaded.state_dict().values()}


def test_models_it_cannot_prune_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="no prunable layer"):
        build_prunable(OnlyHead, input_shape=SHAPE)
    with pytest.raises(ValueError, match=r"parameters outside conv/linear/norm layers \(scale\)"):
        build_prunable(LooseScale, input_shape=SHAPE)
    with pytest.raises(ValueError, match="cannot trace"):  # 3 channels into a 1-channel stem
        build_prunable(TinyResNet, input_shape=(3, 4, 4))
    with pytest.raises(ValueError, match="input_shape"):
        build_prunable(TinyResNet)
    with pytest.raises(ValueError, match="unknown argument"):
        build_prunable(TinyResNet, input_shape=SHAPE, depth=3)
    with pytest.raises(ValueError, match="cannot travel to clients"):
        build_prunable(TinyResNet, input_shape=SHAPE, branches=(nn.ReLU, 2))
    with pytest.raises(ValueError, match="the model's class and its arguments"):
        build_prunable(TinyResNet(), input_shape=SHAPE)  # an instance: clients could not build it
    with pytest.raises(ValueError, match="widths"):
        build_prunable(TinyResNet, input_shape=SHAPE, widths=[2, 3, 2, 4, 7])

    class Local(TinyResNet):
        pass

    with pytest.raises(ValueError, match="top level of a module"):
        build_prunable(Local, input_shape=SHAPE)
