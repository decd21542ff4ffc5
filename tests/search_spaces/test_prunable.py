"""Prunable nets (DecNAS): shapes stay consistent, MACs drop by the computed amount,
the largest-norm filters are kept."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from fedorasflwr.search_spaces.prunable import (
    build_prunable,
    filter_norms,
    prune_layer,
    prune_to_budget,
    resource,
    width_scaled,
)

BN_KEYS = ("weight", "bias", "running_mean", "running_var")
IMAGE = {"num_classes": 10, "in_channels": 1, "input_height": 8, "input_width": 8}


def convnet(widths=(4, 4, 8, 8, 16, 16)):
    torch.manual_seed(0)
    return build_prunable("convnet", widths=widths, **IMAGE).eval()


def mobilenet():
    torch.manual_seed(0)
    widths = (4, 6, 8, 8, 10, 10, 12, 12, 12, 12, 12, 12, 14, 14)
    return build_prunable("mobilenet", widths=widths, **IMAGE).eval()


def measured_macs(net):
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        net(torch.zeros(1, 1, 8, 8))
    return counter.get_total_flops() // 2


def test_the_built_ins_have_the_papers_prunable_layers():
    # K = 6 for ConvNet, 14 for MobileNet (the first CONV and the 13 pointwise ones)
    assert convnet().layer_names() == tuple(f"blocks.{i}.conv" for i in range(6))
    assert mobilenet().layer_names() == ("stem.conv", *(f"blocks.{i}.pw" for i in range(13)))
    assert convnet().spec["name"] == "convnet" and mobilenet().spec["name"] == "mobilenet"


def test_convnet_macs_match_a_hand_count():
    # 8x8 for layers 0-1, pool, 4x4 for 2-3, pool, 2x2 for 4-5, pool, 1x1 into the FC
    hand = (1 * 4 + 4 * 4) * 9 * 64 + (4 * 8 + 8 * 8) * 9 * 16 + (8 * 16 + 16 * 16) * 9 * 4 + 160
    assert hand == 39328
    net = convnet()
    assert resource(net, "macs") == measured_macs(net) == hand


def test_prune_to_budget_removes_exactly_the_computed_filters():
    net = convnet()
    # one filter of layer 3 costs 8 x 9 x 16 MACs there and 16 x 9 x 4 in layer 4: 1728
    pruned = prune_to_budget(net, 3, 39328 - 3000, "macs")
    assert pruned.widths == (4, 4, 8, 6, 16, 16)  # ceil(3000 / 1728) = 2 filters removed
    assert resource(pruned, "macs") == measured_macs(pruned) == 39328 - 2 * 1728
    # params: conv 8x9 + BN 2 per filter in layer 3, 16 x 9 inputs of layer 4
    assert resource(net, "params") - resource(pruned, "params") == 2 * (8 * 9 + 2 + 16 * 9)


def test_prune_to_budget_gives_up_when_a_layer_cannot_meet_the_budget():
    net = convnet()
    assert prune_to_budget(net, 0, 1000, "macs") is None
    assert prune_to_budget(net, 0, 39328, "macs").widths == net.widths  # already within


@pytest.mark.parametrize("make", [convnet, mobilenet])
def test_every_layer_prunes_to_the_fewest_filters_meeting_the_budget(make):
    net = make()
    target = 0.93 * resource(net, "macs")
    for layer in range(net.num_layers):
        pruned = prune_to_budget(net, layer, target, "macs")
        if pruned is None:
            continue
        assert resource(pruned, "macs") == measured_macs(pruned) <= target
        keep = pruned.widths[layer]
        assert keep < net.widths[layer]
        assert resource(prune_layer(net, layer, keep + 1), "macs") > target  # fewest removed
        rebuilt = build_prunable(**pruned.spec)
        rebuilt.load_state_dict(pruned.state_dict(), strict=True)  # shapes consistent
        assert pruned(torch.randn(2, 1, 8, 8)).shape == (2, 10)


_BN = {"conv": "bn", "pw": "pw_bn"}  # the BN after each kind of prunable CONV of the two nets


def _silence(net, layer, filters):
    """Make ``filters`` of ``layer`` output exact zeros (weights, BN shift and mean zero)."""
    conv = net.layer_names()[layer]
    parent, _, leaf = conv.rpartition(".")
    bn = f"{parent}.{_BN[leaf]}"
    state = net.state_dict()
    index = torch.tensor(filters)
    for key in (f"model.{conv}.weight", *(f"model.{bn}.{k}" for k in BN_KEYS)):
        state[key].index_fill_(0, index, 1.0 if key.endswith("running_var") else 0.0)
    net.load_state_dict(state)


@pytest.mark.parametrize("make", [convnet, mobilenet])
def test_pruning_silent_filters_changes_no_output(make):
    net = make()
    x = torch.randn(3, 1, 8, 8)
    for layer in range(net.num_layers):
        silenced = make()
        silenced.load_state_dict(net.state_dict())
        _silence(silenced, layer, [0, 2])
        reference = silenced(x)
        pruned = prune_layer(silenced, layer, silenced.widths[layer] - 2)
        assert torch.allclose(pruned(x), reference, atol=1e-5), silenced.layer_names()[layer]


def test_pruning_keeps_the_largest_norm_filters_and_slices_consumers():
    net = convnet()
    state = net.state_dict()
    weight = torch.ones(4, 4, 3, 3) * torch.tensor([3.0, 1.0, 4.0, 2.0]).view(4, 1, 1, 1)
    state["model.blocks.1.conv.weight"] = weight
    net.load_state_dict(state)
    assert filter_norms(net, 1).tolist() == pytest.approx(
        [18.0, 6.0, 24.0, 12.0]
    )  # 3 x sqrt(36) ...
    pruned = prune_layer(net, 1, 2)
    kept = [0, 2]  # norms 18 and 24, in their original order
    after = pruned.state_dict()
    assert torch.equal(after["model.blocks.1.conv.weight"], weight[kept])
    assert torch.equal(
        after["model.blocks.1.bn.running_var"], state["model.blocks.1.bn.running_var"][kept]
    )
    assert torch.equal(
        after["model.blocks.2.conv.weight"], state["model.blocks.2.conv.weight"][:, kept]
    )
    assert torch.equal(after["model.blocks.0.conv.weight"], state["model.blocks.0.conv.weight"])
    assert pruned.widths == (4, 2, 8, 8, 16, 16)


def test_mobilenet_pruning_slices_the_depthwise_partner_and_the_classifier():
    net = mobilenet()
    state = net.state_dict()
    pruned = prune_layer(net, 2, 5)
    kept = torch.sort(torch.argsort(filter_norms(net, 2), descending=True)[:5]).values
    after = pruned.state_dict()
    assert torch.equal(after["model.blocks.1.pw.weight"], state["model.blocks.1.pw.weight"][kept])
    assert torch.equal(after["model.blocks.2.dw.weight"], state["model.blocks.2.dw.weight"][kept])
    assert torch.equal(after["model.blocks.2.dw_bn.bias"], state["model.blocks.2.dw_bn.bias"][kept])
    assert torch.equal(
        after["model.blocks.2.pw.weight"], state["model.blocks.2.pw.weight"][:, kept]
    )
    last = prune_layer(net, 13, 3)
    assert last.state_dict()["model.classifier.weight"].shape == (10, 3)


def test_width_multiplier_fits_the_budget_and_the_defaults_scale():
    net = build_prunable("convnet", width=0.25, **IMAGE)
    assert net.widths == (8, 8, 16, 16, 32, 32)
    scaled = width_scaled(net, 0.5 * resource(net, "macs"))
    assert resource(scaled, "macs") <= 0.5 * resource(net, "macs")
    assert all(s <= w for s, w in zip(scaled.widths, net.widths, strict=True))
    with pytest.raises(ValueError, match="widths"):
        build_prunable("convnet", widths=[4, 4], **IMAGE)
    with pytest.raises(ValueError, match="valid: convnet, mobilenet"):
        build_prunable("resnet", **IMAGE)


def test_a_fresh_net_at_given_widths_is_initialised_for_its_own_fan_in():
    net = convnet()  # widths (4, 4, 8, 8, 16, 16) from the full (32, 32, 64, ...) ConvNet
    weight = net.state_dict()["model.blocks.1.conv.weight"]  # 4 x 4 x 3 x 3
    bound = 1 / (4 * 9) ** 0.5  # Conv2d's default: uniform within 1 / sqrt(fan_in)
    assert weight.abs().max() <= bound
    assert weight.abs().max() > 1 / (32 * 9) ** 0.5  # not the full net's smaller bound
