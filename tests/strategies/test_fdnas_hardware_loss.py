"""FDNAS's hardware term, both forms (``fdnas.hardware-loss``): values and alpha gradients
against hand-computed ones, and the client's alpha-step schedule (``fdnas.alpha-every``)."""

from __future__ import annotations

import math

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from fedorasflwr.client_app import app as client_app
from fedorasflwr.config import parse_run_config
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.methods.fdnas import client
from fedorasflwr.methods.fdnas.client import hardware_loss, search_supernet
from fedorasflwr.protocol import ARRAYS, CONFIG, space_to_config
from fedorasflwr.search_spaces import build_space
from tests.runconfig import pyproject_run_config, tiny_fdnas
from tests.strategies.test_fdnas import NUM_NODES, _synthetic_client, make_strategy


def _space():
    space = build_space("mbconv", width=0.25, layers_per_stage=1)
    with torch.no_grad():  # distinct probabilities in every layer
        for alpha in space.arch_parameters():
            alpha.copy_(torch.linspace(-1.0, 1.0, len(alpha)))
    return space


def _expected_flops_gradient(space, layer):
    """dE[FLOPs]/dalpha of one layer by hand: p_i (f_i - sum_j p_j f_j)."""
    alpha = space.arch_parameters()[layer].detach().double()
    p = torch.softmax(alpha, 0)
    f = torch.tensor([float(space.option_cost(layer, o).flops) for o in range(len(alpha))])
    return p * (f.double() - (p * f.double()).sum()), f


@pytest.mark.parametrize("scale", [0.5, 2.0])
def test_add_linear_is_lambda_times_the_relative_gap_and_its_gradient_lambda_over_target(scale):
    space = _space()
    expected = float(space.expected_flops().detach())
    target = expected * scale
    loss = hardware_loss(space, target, 0.05, form="add-linear")
    # 0.05 (E - T) / T: +0.05 with T = E/2, -0.025 with T = 2E
    assert float(loss.detach()) == pytest.approx(0.05 * (1 / scale - 1), rel=1e-6)
    loss.backward()
    for layer, alpha in enumerate(space.arch_parameters()):
        by_hand, flops = _expected_flops_gradient(space, layer)
        torch.testing.assert_close(alpha.grad.double(), 0.05 / target * by_hand)
        # below or above the target alike, descent lowers the logits of the costlier options
        mean = float((torch.softmax(alpha.detach().double(), 0) * flops).sum())
        assert torch.all((alpha.grad > 0) == (flops > mean))


@pytest.mark.parametrize("scale", [0.5, 2.0])
def test_log_gap_is_beta_log_squared_and_its_gradient_turns_at_the_target(scale):
    space = _space()
    expected = float(space.expected_flops().detach())
    target = expected * scale
    loss = hardware_loss(space, target, 2.0)  # form "log-gap", the default
    assert float(loss.detach()) == pytest.approx(2.0 * math.log(2.0) ** 2, rel=1e-5)
    loss.backward()
    gap = math.log(expected / target)
    for layer, alpha in enumerate(space.arch_parameters()):
        by_hand, flops = _expected_flops_gradient(space, layer)
        # d/dalpha 2 log(E/T)^2 = 4 log(E/T) / E x dE/dalpha
        torch.testing.assert_close(alpha.grad.double(), 4.0 * gap / expected * by_hand)
        mean = float((torch.softmax(alpha.detach().double(), 0) * flops).sum())
        # above the target (scale 0.5) descent lowers the costlier options, below it raises them
        assert torch.all((alpha.grad > 0) == ((flops > mean) if scale < 1 else (flops < mean)))


def test_an_unknown_form_is_refused():
    with pytest.raises(ValueError, match="'mul-log'.*log-gap, add-linear"):
        hardware_loss(_space(), 1e6, 1.0, form="mul-log")


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("fdnas.hardware-loss", "mul-log", r"'fdnas.hardware-loss'.*mul-log"),
        ("fdnas.hardware-lambda", -0.1, r"'fdnas.hardware-lambda' = -0.1"),
    ],
)
def test_bad_settings_name_the_key(key, value, message):
    with pytest.raises(ValueError, match=message):
        parse_run_config({**pyproject_run_config(), "method": "fdnas", key: value})


def _search(monkeypatch, **config_overrides):
    """One client search (96 samples, batch 32: 3 weight steps an epoch, 2 epochs); the
    weight of each alpha step's hardware term and the form, in call order."""
    calls = []
    real = client._alpha_step

    def spy(space, inputs, targets, rng, target, weight, expected=None, form="log-gap"):
        calls.append((weight, form))
        return real(space, inputs, targets, rng, target, weight, expected, form)

    monkeypatch.setattr(client, "_alpha_step", spy)
    torch.manual_seed(0)
    space = build_space("mbconv", width=0.25, layers_per_stage=1)
    config = {
        "seed": 0,
        "server-round": 1,
        "local-epochs": 2,
        "batch-size": 32,
        "lr": 0.01,
        "momentum": 0.9,
        "weight-decay": 0.0,
        "alpha-lr": 0.05,
        "alpha-every": 1,
        "target-flops": float(space.min_flops()),
        "hardware-beta": 1.0,
        **space_to_config(space.spec),
        **config_overrides,
    }
    content = RecordDict({ARRAYS: ArrayRecord(space.state_dict()), CONFIG: ConfigRecord(config)})
    search_supernet(content, _synthetic_client(), partition_id=0)
    return calls


def test_one_alpha_step_per_alpha_every_weight_steps(monkeypatch):
    # 6 weight steps: every 1 -> 6 alpha steps, every 2 -> 3, every 5 -> 1 (after step 5)
    for every, steps in ((1, 6), (2, 3), (5, 1), (7, 0)):
        assert len(_search(monkeypatch, **{"alpha-every": every})) == steps


def test_the_client_weights_each_form_by_its_own_key(monkeypatch):
    add_linear = {"hardware-loss": "add-linear", "hardware-lambda": 0.05}
    assert set(_search(monkeypatch, **add_linear)) == {(0.05, "add-linear")}
    log_gap = {"hardware-loss": "log-gap", "hardware-lambda": 0.05}
    assert set(_search(monkeypatch, **log_gap)) == {(1.0, "log-gap")}
    assert set(_search(monkeypatch)) == {(1.0, "log-gap")}  # a server that sends neither key


def test_the_server_sends_the_form_and_both_weights(data_cache):
    config = tiny_fdnas(
        data_cache, **{"fdnas.hardware-loss": "add-linear", "fdnas.hardware-lambda": 0.07}
    )
    strategy = make_strategy(config)
    grid = InProcessGrid(client_app, config, NUM_NODES)
    strategy.setup(grid)
    arrays = ArrayRecord(strategy.space.state_dict())
    messages = list(strategy.configure_train(1, arrays, ConfigRecord(), grid))
    sent = {
        tuple(m.content.config_records[CONFIG][k] for k in ("hardware-loss", "hardware-lambda"))
        for m in messages
    }
    assert sent == {("add-linear", 0.07)}
