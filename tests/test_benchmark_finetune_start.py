"""``benchmarks/finetune_start.py`` (issue 40, item 3): the starts a searched path is
fine-tuned from. The ``rescaled`` start must compute the same function as the supernet's
(else its result says nothing about the step size), and ``fresh-head`` must change only
the classifier."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord

from fedorasflwr.search_spaces import build_space
from tests.test_benchmarks import load_benchmark

SPACE = {
    "name": "cnn_s",
    "width": 0.25,
    "num_classes": 10,
    "in_channels": 1,
    "input_height": 28,
    "input_width": 28,
}


def grown(space, arch, factor: float = 3.0):
    """The path cut from ``space`` with every convolution (and BatchNorm statistics) grown
    by ``factor``, as Stage 1 grows them, and BatchNorm statistics estimated on data."""
    from fedorasflwr.search_spaces.ops import ConvNormAct

    torch.manual_seed(1)
    net = space.subnet(arch)
    with torch.no_grad():
        for module in net.modules():
            if isinstance(module, ConvNormAct):
                module.conv.weight.mul_(factor)
        net.train()
        for _ in range(3):  # running statistics of the grown weights
            net(torch.randn(16, 1, 28, 28))
    return net


def test_rescaled_keeps_the_function_and_gives_each_conv_the_fresh_norm():
    start = load_benchmark("finetune_start")
    torch.manual_seed(0)
    space = build_space(**SPACE)
    arch = space.sample_path(np.random.default_rng(3))
    net = grown(space, arch)
    # the rescale keeps the function up to BatchNorm's eps (1e-5 against running variances
    # of ~0.07 here: ~1e-4 relative per layer, 8e-4 at the max-pooling space's outputs of
    # ~2.5); without it the function is the same to float precision
    for module in net.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.eps = 1e-12
    torch.manual_seed(2)
    fresh = space.fresh().subnet(arch)
    ratios, _ = start.conv_norms(net, fresh)
    assert min(ratios) > 2.0  # grown: the check below could fail
    x = torch.randn(8, 1, 28, 28)
    net.eval()
    before_eval = net(x)
    before_train = copy.deepcopy(net).train()(x)  # a train-mode pass updates the statistics
    start.rescaled(net, fresh)
    ratios, _ = start.conv_norms(net, fresh)
    assert ratios == pytest.approx([1.0] * len(ratios), rel=1e-5)
    net.eval()
    torch.testing.assert_close(net(x), before_eval, rtol=1e-3, atol=1e-4)
    net.train()
    torch.testing.assert_close(net(x), before_train, rtol=1e-3, atol=1e-4)


def test_fresh_head_changes_the_classifier_only_and_rescaled_records_the_norms():
    start = load_benchmark("finetune_start")
    torch.manual_seed(0)
    space = build_space(**SPACE)
    arch = tuple(0 for _ in space.num_options())
    supernet_start = ArrayRecord(grown(space, arch).state_dict())
    context = SimpleNamespace(space=space, federation=SimpleNamespace(seed=0))
    finetune = SimpleNamespace(SUPERNET_INIT="supernet")
    calls = []

    def original(context, supernet, arch, init, tier, candidate=0):
        calls.append(init)
        return supernet_start

    diagnostics: list = []
    initial = start.start_variants(finetune, original, diagnostics)
    plain = supernet_start.to_torch_state_dict()
    head = initial(context, None, arch, "fresh-head", 1).to_torch_state_dict()
    changed = {k for k in plain if not torch.equal(plain[k], head[k])}
    assert changed and all("classifier" in k for k in changed)
    assert not diagnostics
    rescaled = initial(context, None, arch, "rescaled", 1).to_torch_state_dict()
    assert not torch.equal(rescaled[next(iter(plain))], plain[next(iter(plain))])
    assert [d["tier"] for d in diagnostics] == [2]
    assert diagnostics[0]["conv_norm_ratio_min"] > 2.0
    initial(context, None, arch, "random", 1)  # other inits: the original's
    assert calls == ["supernet", "supernet", "random"]


def test_the_mixed_start_halves_the_way_to_fresh_and_cool_head_keeps_every_prediction():
    start = load_benchmark("finetune_start")
    torch.manual_seed(0)
    space = build_space(**SPACE)
    arch = tuple(0 for _ in space.num_options())
    net = grown(space, arch)
    torch.manual_seed(2)
    fresh = space.fresh().subnet(arch)
    mixed = copy.deepcopy(net)
    start.transform("mix-0.5", mixed, fresh)
    key = next(k for k in net.state_dict() if k.endswith("conv.weight"))
    torch.testing.assert_close(
        mixed.state_dict()[key], (net.state_dict()[key] + fresh.state_dict()[key]) / 2
    )
    x = torch.randn(16, 1, 28, 28)
    cool = copy.deepcopy(net)
    start.transform("cool-head", cool, fresh)
    _, head = start.conv_norms(cool, fresh)
    assert head == pytest.approx(1.0, rel=1e-5)  # the classifier at the fresh one's norm
    net.eval(), cool.eval()
    with torch.no_grad():
        assert torch.equal(net(x).argmax(1), cool(x).argmax(1))
        assert cool(x).abs().max() < net(x).abs().max()  # cooler logits


def test_dead_share_counts_the_channels_a_negative_shift_silences():
    start = load_benchmark("finetune_start")
    from torch import nn

    from fedorasflwr.search_spaces.ops import ConvNormAct

    torch.manual_seed(0)
    space = build_space(**SPACE)
    net = space.subnet(tuple(0 for _ in space.num_options()))
    batch = torch.randn(32, 1, 28, 28)
    assert start.dead_share(net, batch) == 0.0  # fresh BatchNorm: about half of each map > 0
    blocks = [m for m in net.modules() if isinstance(m, ConvNormAct) and isinstance(m.act, nn.ReLU)]
    total = sum(m.norm.num_features for m in blocks)
    with torch.no_grad():
        blocks[0].norm.bias[:2] = -100.0  # two stem channels never pass the ReLU
    assert start.dead_share(net, batch) == pytest.approx(2 / total)
