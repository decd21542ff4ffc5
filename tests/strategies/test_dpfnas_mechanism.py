"""DP-FNAS client mechanism and accounting against slow, obviously correct references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from opacus.accountants import RDPAccountant
from torch import nn

from fedorasflwr.clients.dpfnas import (
    clip_and_noise,
    per_sample_gradients,
    poisson_sample,
    weight_gradient,
)
from fedorasflwr.config import parse_run_config
from fedorasflwr.data import load_client_data
from fedorasflwr.protocol import ARRAYS, CONFIG, space_to_config
from fedorasflwr.search_spaces import build_space
from fedorasflwr.strategies.privacy import epsilon, gdp_mu
from tests.runconfig import pyproject_run_config


@pytest.fixture(scope="module")
def space():
    torch.manual_seed(0)
    return build_space("darts", channels=2, cells=2, input_height=28, input_width=28, stem_stride=2)


@pytest.fixture(scope="module")
def client_data(data_cache):
    config = pyproject_run_config()
    config.update({"data.cache-dir": str(data_cache), "data.partitioner": "iid"})
    return load_client_data(parse_run_config(config).data, 0, 60)


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
    from fedorasflwr.config import DPFNASSettings

    with pytest.raises(ValueError, match=r"dpfnas\.mode.*'private'"):
        DPFNASSettings.from_config({"dpfnas.mode": "private"})
    with pytest.raises(ValueError, match=r"dpfnas\.noise-weights"):
        DPFNASSettings.from_config({"dpfnas.noise-weights": -1.0})
    settings = DPFNASSettings.from_config({"dpfnas.mode": "fnas"})
    assert not settings.noisy and settings.noise_weights == 1.0
