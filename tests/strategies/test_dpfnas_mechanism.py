"""DP-FNAS client mechanism and accounting against slow, obviously correct references."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from opacus.accountants import RDPAccountant
from torch import nn

from fedorasflwr.methods.dpfnas.client import (
    clip_and_noise,
    per_sample_gradients,
    poisson_sample,
    weight_gradient,
)
from fedorasflwr.methods.dpfnas.privacy import epsilon, gdp_mu
from fedorasflwr.protocol import ARRAYS, CONFIG, space_to_config
from fedorasflwr.search_spaces import build_space
from fedorasflwr.search_spaces.darts import DartsSpace


def batch(data, count):
    x = torch.stack([data.train[i][0] for i in range(count)])
    y = torch.stack([data.train[i][1] for i in range(count)])
    return x, y


def test_per_sample_gradients_match_a_per_sample_loop(space, client_data):
    x, y = batch(client_data, 5)
    named = dict(space.named_parameters())
    wrt = {k: named[k] for k in space.weight_keys()}
    fast = per_sample_gradients(space, wrt, x, y)
    for i in range(5):
        space.zero_grad()
        nn.functional.cross_entropy(space(x[i : i + 1]), y[i : i + 1]).backward()
        for key in wrt:
            torch.testing.assert_close(fast[key][i], named[key].grad, atol=1e-6, rtol=1e-4)
    space.zero_grad()


def test_clipping_bounds_every_per_sample_contribution(space, client_data):
    x, y = batch(client_data, 8)
    named = dict(space.named_parameters())
    per_sample = per_sample_gradients(space, {k: named[k] for k in space.weight_keys()}, x, y)
    clip = 0.05
    for i in range(8):
        alone = {k: v[i : i + 1] for k, v in per_sample.items()}
        raw = math.sqrt(sum(float(v.pow(2).sum()) for v in alone.values()))
        out, clipped = clip_and_noise(
            alone,
            clip=clip,
            noise_multiplier=0.0,
            expected_batch=1.0,
            generator=torch.Generator(),
        )
        norm = math.sqrt(sum(float(v.pow(2).sum()) for v in out.values()))
        assert norm <= clip * (1 + 1e-5)
        assert norm == pytest.approx(min(raw, clip), rel=1e-4)
        assert clipped == float(raw > clip)


def test_noise_std_matches_sigma_times_clip():
    sigma, clip, draws = 1.7, 0.3, 200
    zeros = {"w": torch.zeros(3, 2000)}  # three samples with zero gradient
    generator = torch.Generator().manual_seed(0)
    noise = torch.stack(
        [
            clip_and_noise(
                zeros,
                clip=clip,
                noise_multiplier=sigma,
                expected_batch=1.0,
                generator=generator,
            )[0]["w"]
            for _ in range(draws)
        ]
    )
    assert float(noise.mean()) == pytest.approx(0.0, abs=0.01)
    assert float(noise.std()) == pytest.approx(sigma * clip, rel=0.05)


def test_without_noise_the_party_gradient_is_the_plain_average(space, client_data):
    n = len(client_data.train)
    config = ConfigRecord(
        {
            "seed": 0,
            "server-round": 1,
            "sample-rate": 1.0,  # every sample, so the divisor p N is the batch size
            "clip": 1e9,
            "noise-multiplier": 0.0,
            "order": 1,
            "weight-lr": 0.1,
            "mixed-flops": 1,
            **space_to_config(space.spec),
        }
    )
    content = RecordDict({ARRAYS: ArrayRecord(space.state_dict()), CONFIG: config})
    reply = weight_gradient(content, client_data, partition_id=0)
    x, y = batch(client_data, n)
    space.zero_grad()
    nn.functional.cross_entropy(space(x), y).backward()
    gradient = reply.array_records[ARRAYS]
    assert set(gradient) == set(space.weight_keys())
    named = dict(space.named_parameters())
    for key in space.weight_keys():
        torch.testing.assert_close(
            torch.from_numpy(gradient[key].numpy()), named[key].grad, atol=1e-6, rtol=1e-4
        )
    space.zero_grad()


def test_poisson_sampling_rate():
    rng = np.random.default_rng(0)
    sizes = [len(poisson_sample(rng, 1000, 0.05)) for _ in range(400)]
    assert np.mean(sizes) == pytest.approx(50, rel=0.03)
    assert np.std(sizes) > 3  # variable batch size, not a fixed-size draw


@pytest.mark.parametrize(("sigma", "rate", "steps"), [(1.0, 0.05, 20), (0.7, 0.2, 7)])
def test_epsilon_equals_opacus_rdp_accountant(sigma, rate, steps):
    accountant = RDPAccountant()
    for _ in range(steps):
        accountant.step(noise_multiplier=sigma, sample_rate=rate)
    assert epsilon(sigma, rate, steps, 1e-5) == pytest.approx(accountant.get_epsilon(1e-5))


def test_gdp_mu_is_theorem_3_1():
    assert gdp_mu(1.0, 0.1, 100) == pytest.approx(0.1 * math.sqrt(100 * (math.e - 1)))
    assert gdp_mu(0.0, 0.1, 100) == math.inf
    assert gdp_mu(1.0, 0.1, 0) == 0.0


def test_settings_name_the_bad_key():
    from fedorasflwr.strategies import DPFNASSettings

    with pytest.raises(ValueError, match=r"dpfnas\.mode.*'private'"):
        DPFNASSettings.from_config({"dpfnas.mode": "private"})
    with pytest.raises(ValueError, match=r"dpfnas\.noise-weights"):
        DPFNASSettings.from_config({"dpfnas.noise-weights": -1.0})
    settings = DPFNASSettings.from_config({"dpfnas.mode": "fnas"})
    assert not settings.noisy and settings.noise_weights == 1.0
    # the non-private final training clips each step at 5 (DARTS's augmentation) unless set
    assert settings.final.client_config()["grad-clip"] == 5.0
    off = DPFNASSettings.from_config({"dpfnas.final-grad-clip": 0.0})
    assert "grad-clip" not in off.final.client_config()
    with pytest.raises(ValueError, match=r"'dpfnas\.final-grad-clip' = -1\.0.*>= 0"):
        DPFNASSettings.from_config({"dpfnas.final-grad-clip": -1.0})


def _second_order_setup(seed=0):
    """A tiny supernet, its W before (``previous``) and after (``current``) one SGD
    step, and a party with 6 training and 3 validation samples (16 x 16 digits)."""
    from fedorasflwr.data import ClientData
    from fedorasflwr.methods.dpfnas.contract import PREVIOUS_PREFIX

    torch.manual_seed(seed)
    tiny = build_space("darts", channels=2, cells=3, input_height=16, input_width=16)
    with torch.no_grad():  # alphas away from uniform: the mixed-op Hessian is not degenerate
        for key in ("net.alpha_normal", "net.alpha_reduce"):
            dict(tiny.named_parameters())[key].normal_(0.0, 0.5)
    g = torch.Generator().manual_seed(seed)
    train = torch.utils.data.TensorDataset(
        torch.randn(6, 1, 16, 16, generator=g), torch.randint(0, 10, (6,), generator=g)
    )
    val = torch.utils.data.TensorDataset(
        torch.randn(3, 1, 16, 16, generator=g), torch.randint(0, 10, (3,), generator=g)
    )
    data = ClientData(train=train, val=val, test=val, num_classes=10, label_counts=(1,) * 10)
    previous = {k: v.detach().clone() for k, v in tiny.state_dict().items()}
    xi = 0.5
    x, y = train.tensors
    tiny.zero_grad()
    nn.functional.cross_entropy(tiny(x), y).backward()
    with torch.no_grad():  # W' = W - xi grad_W L_tr(W): the server's W step
        for key, parameter in tiny.named_parameters():
            if key in tiny.weight_keys():
                parameter -= xi * parameter.grad
    tiny.zero_grad()
    arrays = ArrayRecord(tiny.state_dict())
    for key in tiny.weight_keys():
        arrays[PREVIOUS_PREFIX + key] = ArrayRecord({key: previous[key]})[key]
    return tiny, previous, data, arrays, xi


def _arch_reply(tiny, arrays, data, xi, order):
    from fedorasflwr.methods.dpfnas.client import architecture_gradient

    config = ConfigRecord(
        {
            "seed": 0,
            "server-round": 1,
            "sample-rate": 1.0,  # every sample: deterministic, divisor = batch size
            "clip": 1e9,
            "noise-multiplier": 0.0,
            "order": order,
            "weight-lr": xi,
            "mixed-flops": 1,
            **space_to_config(tiny.spec),
        }
    )
    content = RecordDict({ARRAYS: arrays, CONFIG: config})
    reply = architecture_gradient(content, data, partition_id=0)
    return {k: torch.from_numpy(v.numpy()) for k, v in reply.array_records[ARRAYS].items()}


def _hand_second_order(tiny, previous, data, xi, scale=0.01):
    """Eq. 5 by plain autograd, one validation sample at a time, in float64: returns the
    mean over samples of grad_A L_val^i(W') and of the finite-difference term
    -xi (grad_A L_tr(W+) - grad_A L_tr(W-)) / (2 eps), W+- = W +- eps v_i,
    v_i = grad_W' L_val^i(W'), eps = scale / ||v_i||; and of the exact term
    -xi (d^2 L_tr / dA dW)(W) v_i (double backward)."""
    net = copy.deepcopy(tiny).double()
    named = dict(net.named_parameters())
    arch_keys, weight_keys = DartsSpace.ARCH_KEYS, list(tiny.weight_keys())
    vx, vy = (t.double() if t.is_floating_point() else t for t in data.val.tensors)
    tx, ty = (t.double() if t.is_floating_point() else t for t in data.train.tensors)
    current = {k: named[k].detach().clone() for k in weight_keys}

    def set_weights(values):
        with torch.no_grad():
            for key in weight_keys:
                named[key].copy_(values[key])

    def train_loss():
        return nn.functional.cross_entropy(net(tx), ty)

    first = {k: torch.zeros_like(named[k]) for k in arch_keys}
    finite = {k: torch.zeros_like(named[k]) for k in arch_keys}
    exact = {k: torch.zeros_like(named[k]) for k in arch_keys}
    count = len(vy)
    for i in range(count):
        set_weights(current)
        loss = nn.functional.cross_entropy(net(vx[i : i + 1]), vy[i : i + 1])
        grads = torch.autograd.grad(loss, [named[k] for k in (*arch_keys, *weight_keys)])
        grad_a, v = (
            grads[: len(arch_keys)],
            dict(zip(weight_keys, grads[len(arch_keys) :], strict=True)),
        )
        eps = scale / torch.sqrt(sum(g.pow(2).sum() for g in v.values()))
        sides = []
        for sign in (1.0, -1.0):
            set_weights({k: previous[k].double() + sign * eps * v[k] for k in weight_keys})
            sides.append(torch.autograd.grad(train_loss(), [named[k] for k in arch_keys]))
        set_weights({k: previous[k].double() for k in weight_keys})
        grad_w = torch.autograd.grad(
            train_loss(), [named[k] for k in weight_keys], create_graph=True
        )
        inner = sum((g * v[k]).sum() for g, k in zip(grad_w, weight_keys, strict=True))
        mixed = torch.autograd.grad(inner, [named[k] for k in arch_keys])
        for j, key in enumerate(arch_keys):
            first[key] += grad_a[j] / count
            finite[key] += -xi * (sides[0][j] - sides[1][j]) / (2 * eps) / count
            exact[key] += -xi * mixed[j] / count
    return first, finite, exact


def _flat(arrays):
    return torch.cat([arrays[k].flatten().double() for k in DartsSpace.ARCH_KEYS])


def test_second_order_architecture_gradient_is_eq5():
    """order 2 (the paper's Eq. 5 with DARTS' eps = 0.01 / ||v||): the client's vmapped
    per-sample estimate equals a hand-computed one (plain autograd, float64), it
    really differs from order 1, and Eq. 5's finite difference is, for a small eps,
    the exact mixed second derivative -xi (d^2 L_tr / dA dW) v (sign and scale)."""
    tiny, previous, data, arrays, xi = _second_order_setup()
    client_first = _flat(_arch_reply(tiny, arrays, data, xi, order=1))
    client_second = _flat(_arch_reply(tiny, arrays, data, xi, order=2))
    first, finite, exact = (_flat(d) for d in _hand_second_order(tiny, previous, data, xi))

    torch.testing.assert_close(client_first, first, atol=1e-6, rtol=1e-4)
    correction = client_second - client_first
    assert correction.norm() > 0.1 * client_first.norm()  # not negligible: order 2 differs
    assert (correction - finite).norm() <= 1e-3 * finite.norm()
    # the finite difference converges to the exact term: eps -> 0 (float64)
    _, finite_small, _ = (_flat(d) for d in _hand_second_order(tiny, previous, data, xi, 1e-6))
    assert (finite_small - exact).norm() <= 1e-4 * exact.norm()
    assert (finite - exact).norm() > 10 * (finite_small - exact).norm()  # a real limit
