"""Gradient clipping (FedorAS's RNN recipe): local SGD and the Stage-1 loop scale each
step's gradient to at most ``grad-clip`` in L2 norm, checked on a hand-computed step."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from fedorasflwr.config import parse_run_config
from fedorasflwr.methods.fedoras.client import supernet_epochs
from fedorasflwr.search_spaces import build_space
from fedorasflwr.seeding import stream_words
from fedorasflwr.training import local_sgd
from tests.runconfig import pyproject_run_config as defaults

WORDS = stream_words(0, "test-grad-clip", 0)


def one_step(clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One SGD step (lr 1, no momentum) of a zero linear layer on x = (300, 400), label 0."""
    net = nn.Linear(2, 2)
    nn.init.zeros_(net.weight)
    nn.init.zeros_(net.bias)
    data = TensorDataset(torch.tensor([[300.0, 400.0]]), torch.tensor([0]))
    config = {"local-epochs": 1, "batch-size": 1, "lr": 1.0, "momentum": 0.0}
    local_sgd(net, data, {**config, "grad-clip": clip} if clip else config, WORDS)
    # local_sgd leaves the net on torch_device() (CUDA when present): read it on the CPU
    return net.weight.detach().cpu(), net.bias.detach().cpu()


def test_local_sgd_clips_the_step_to_the_hand_computed_norm():
    # logits 0, softmax (1/2, 1/2): dL/dlogits = (-1/2, 1/2); dL/dW = its outer product with
    # x, dL/db = itself; norm sqrt(2 * 250^2 / 4 * 4 + 1/2) = sqrt(125000.5)
    logit_grad = np.array([-0.5, 0.5])
    grad_w, grad_b = np.outer(logit_grad, [300.0, 400.0]), logit_grad
    norm = math.sqrt(125000.5)
    weight, bias = one_step(clip=0.0)
    np.testing.assert_allclose(weight.numpy(), -grad_w, rtol=1e-6)
    weight, bias = one_step(clip=5.0)
    np.testing.assert_allclose(weight.numpy(), -grad_w * 5.0 / norm, rtol=1e-5)
    np.testing.assert_allclose(bias.numpy(), -grad_b * 5.0 / norm, rtol=1e-5)
    step = math.sqrt(float((weight**2).sum() + (bias**2).sum()))
    assert step == pytest.approx(5.0, rel=1e-5)
    # a bound above the gradient's norm leaves the step alone
    weight, _ = one_step(clip=1e6)
    np.testing.assert_allclose(weight.numpy(), -grad_w, rtol=1e-6)


@pytest.mark.parametrize("clip", [0.0, 1e-3])
def test_stage1_steps_stay_within_lr_times_the_clip(clip):
    torch.manual_seed(0)
    space = build_space("cnn_s", num_classes=10, in_channels=1, input_height=28, input_width=28)
    before = {k: v.detach().clone() for k, v in space.named_parameters()}
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(8, 1, 28, 28, generator=generator), torch.randint(0, 10, (8,)))
    config = {
        "local-epochs": 1,
        "batch-size": 8,  # one step
        "lr": 0.1,
        "momentum": 0.0,
        "weight-decay": 0.0,
        "grad-clip": clip,
    }
    supernet_epochs(space, data, config, WORDS, space.full_subspace(), float(space.max_flops()))
    step = math.sqrt(
        sum(float(((v.detach().cpu() - before[k]) ** 2).sum()) for k, v in space.named_parameters())
    )
    if clip:
        assert step == pytest.approx(0.1 * clip, rel=1e-4)
    else:
        assert step > 100 * 0.1 * 1e-3  # unclipped: far larger


def test_grad_clip_defaults_to_5_for_the_rnn_space_only():
    assert parse_run_config(defaults()).method_settings.grad_clip == 0.0
    rnn = parse_run_config({**defaults(), "space.name": "rnn"})
    assert rnn.method_settings.grad_clip == 5.0
    off = parse_run_config({**defaults(), "space.name": "rnn", "fedoras.grad-clip": "0"})
    assert off.method_settings.grad_clip == 0.0
    assert (
        parse_run_config({**defaults(), "fedoras.grad-clip": "2.5"}).method_settings.grad_clip
        == 2.5
    )
    for bad in ("-2", "nan", "inf", "five"):
        with pytest.raises(ValueError, match=f"'fedoras.grad-clip' = '{bad}'"):
            parse_run_config({**defaults(), "fedoras.grad-clip": bad})
    with pytest.raises(ValueError, match="'fedoras.grad-clip' = 5: expected a str"):
        parse_run_config({**defaults(), "fedoras.grad-clip": 5})
    step = parse_run_config({**defaults(), "fedoras.finetune-lr-schedule": "step"})
    assert step.method_settings.finetune_lr_schedule == "step"
    with pytest.raises(ValueError, match="finetune-lr-schedule"):
        parse_run_config({**defaults(), "fedoras.finetune-lr-schedule": "linear"})
