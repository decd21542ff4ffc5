"""DP-FNAS noise secrecy: a party's noise and samples come from its OS CSPRNG, so the server
(which knows the seed, the round and the partition id) cannot regenerate and remove them;
only ``dpfnas.insecure-reproducible-noise`` makes them reproducible, and says so."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from fedorasflwr.client_app import app as client_app
from fedorasflwr.config import parse_run_config
from fedorasflwr.federation.base import StageFailedError
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.methods.dpfnas.client import (
    architecture_gradient,
    poisson_sample,
    train_final,
    weight_gradient,
)
from fedorasflwr.methods.dpfnas.contract import DPFNAS_ARCH, DPFNAS_WEIGHTS, INSECURE_KEY
from fedorasflwr.methods.dpfnas.runner import run_dpfnas
from fedorasflwr.methods.dpfnas.secure_random import SecureRandom
from fedorasflwr.methods.dpfnas.strategy import DPFNAS
from fedorasflwr.protocol import ARRAYS, CONFIG, space_to_config
from fedorasflwr.runs import build_supernet
from fedorasflwr.search_spaces.darts import DerivedNetwork
from fedorasflwr.seeding import stream_words, torch_generator
from tests.strategies.test_dpfnas_strategy import tiny_dpfnas

SIGMA, CLIP = 1.0, 0.5


def _content(space, rate=0.5, noise=SIGMA, **extra):
    config = ConfigRecord(
        {
            "seed": 0,
            "server-round": 3,
            "sample-rate": rate,
            "clip": CLIP,
            "noise-multiplier": noise,
            "order": 1,
            "weight-lr": 0.1,
            "mixed-flops": 1,
            **extra,
            **space_to_config(space.spec),
        }
    )
    return RecordDict({ARRAYS: ArrayRecord(space.state_dict()), CONFIG: config})


def _flat(reply):
    arrays = reply.array_records[ARRAYS]
    return np.concatenate([arrays[k].numpy().ravel() for k in sorted(arrays)])


@pytest.mark.parametrize("exchange", [weight_gradient, architecture_gradient])
def test_same_seed_and_config_give_different_noised_gradients(space, client_data, exchange):
    first = _flat(exchange(_content(space), client_data, partition_id=0))
    second = _flat(exchange(_content(space), client_data, partition_id=0))
    assert first.shape == second.shape
    assert not np.allclose(first, second)
    # not a constant offset either: the difference has the spread of two independent noises
    split = client_data.train if exchange is weight_gradient else client_data.val
    expected = math.sqrt(2) * SIGMA * CLIP / (0.5 * len(split))
    assert float(np.std(first - second)) == pytest.approx(expected, rel=0.25)


@pytest.mark.parametrize("exchange", [weight_gradient, architecture_gradient])
def test_insecure_key_makes_the_noise_reproducible(space, client_data, exchange):
    content = _content(space, **{INSECURE_KEY: True})
    first = _flat(exchange(content, client_data, partition_id=0))
    second = _flat(exchange(_content(space, **{INSECURE_KEY: True}), client_data, 0))
    np.testing.assert_array_equal(first, second)
    assert not np.array_equal(first, _flat(exchange(_content(space), client_data, 0)))


def test_the_server_cannot_subtract_the_noise(space, client_data):
    """The attack of issue 14: regenerate the noise from (seed, round, partition id, phase)
    and subtract it.  Against the insecure key it recovers the clipped gradient to float
    rounding; against the default it is off by the full noise."""
    n = len(client_data.train)
    clean = _flat(weight_gradient(_content(space, rate=1.0, noise=0.0), client_data, 0))

    def attack(reply: np.ndarray) -> np.ndarray:
        generator = torch_generator(stream_words(0, "dpfnas-weights", 3, 0))  # all public
        named = dict(space.named_parameters())
        noise = {  # drawn in the client's order: the space's weight keys
            key: torch.normal(0.0, SIGMA * CLIP, tuple(named[key].shape), generator=generator)
            for key in space.weight_keys()
        }
        return reply - np.concatenate([noise[k].numpy().ravel() for k in sorted(noise)]) / n

    insecure_content = _content(space, rate=1.0, **{INSECURE_KEY: True})
    insecure = _flat(weight_gradient(insecure_content, client_data, 0))
    assert np.abs(attack(insecure) - clean).max() < 1e-6
    secure = _flat(weight_gradient(_content(space, rate=1.0), client_data, 0))
    residual = attack(secure) - clean
    assert float(np.std(residual)) == pytest.approx(math.sqrt(2) * SIGMA * CLIP / n, rel=0.25)


def test_private_final_training_is_not_reproducible(space, client_data):
    genotype = space.genotype()
    spec = {"channels": 2, "cells": 2, "input_height": 28, "input_width": 28, "stem_stride": 2}
    torch.manual_seed(0)
    net = DerivedNetwork(genotype, **spec)
    space_config = space_to_config({"name": "darts", **spec})

    def content(**extra):
        config = ConfigRecord(
            {
                "seed": 0,
                "server-round": 1,
                "genotype": genotype.to_text(),
                "local-epochs": 1,
                "batch-size": 256,
                "lr": 0.05,
                "momentum": 0.0,
                "noise-multiplier": 1.0,
                "clip": 1.0,
                "net-flops": 1,
                **extra,
                **space_config,
            }
        )
        return RecordDict({ARRAYS: ArrayRecord(net.state_dict()), CONFIG: config})

    def trained(**extra):
        return _flat(train_final(content(**extra), client_data, 0))

    assert not np.allclose(trained(), trained())
    np.testing.assert_array_equal(trained(**{INSECURE_KEY: True}), trained(**{INSECURE_KEY: True}))


@pytest.mark.parametrize("epochs", [1, 3])
def test_final_training_weighs_by_dataset_size_whatever_the_epochs(space, client_data, epochs):
    # the reply's num-examples is bounded by the profile's num-train: samples seen over
    # several local epochs (3 x N) were dropped as inflated, every reply of every round
    genotype = space.genotype()
    spec = {"channels": 2, "cells": 2, "input_height": 28, "input_width": 28, "stem_stride": 2}
    net = DerivedNetwork(genotype, **spec)
    config = ConfigRecord(
        {
            "seed": 0,
            "server-round": 1,
            "genotype": genotype.to_text(),
            "local-epochs": epochs,
            "batch-size": 64,
            "lr": 0.05,
            "momentum": 0.0,
            "net-flops": 1,
            **space_to_config({"name": "darts", **spec}),
        }
    )
    content = RecordDict({ARRAYS: ArrayRecord(net.state_dict()), CONFIG: config})
    metrics = train_final(content, client_data, 0).metric_records["metrics"]
    assert metrics["num-examples"] == len(client_data.train)


def test_secure_random_draws():
    source = SecureRandom()
    uniforms = source.random(200_000)
    assert uniforms.min() >= 0.0 and uniforms.max() < 1.0
    assert float(uniforms.mean()) == pytest.approx(0.5, abs=0.005)
    assert len(np.unique(uniforms)) == len(uniforms)  # 53 random bits each: no repeats
    noise = source.normal(1.7, (400, 1000), torch.float32)
    assert noise.dtype == torch.float32 and noise.shape == (400, 1000)
    assert float(noise.mean()) == pytest.approx(0.0, abs=0.01)
    assert float(noise.std()) == pytest.approx(1.7, rel=0.01)
    # Gaussian tails: P(|z| > 3) = 0.0027
    assert float((noise.abs() > 3 * 1.7).float().mean()) == pytest.approx(0.0027, rel=0.15)
    sizes = [len(poisson_sample(source, 1000, 0.05)) for _ in range(400)]
    assert np.mean(sizes) == pytest.approx(50, rel=0.03)
    assert np.std(sizes) > 3


def seeded_noise_run(data_cache):
    """One search iteration, no final training, the server asking for seeded noise."""
    return tiny_dpfnas(
        data_cache,
        **{
            "dpfnas.iterations": 1,
            "dpfnas.final-rounds": 0,
            "dpfnas.insecure-reproducible-noise": True,
        },
    )


def test_insecure_run_warns_and_says_so_in_the_result(data_cache, tmp_path, caplog):
    config = seeded_noise_run(data_cache)
    settings = parse_run_config(config)
    assert settings.method_settings.insecure_reproducible_noise
    allowed = dict.fromkeys(range(2), {"allow-reproducible-noise": True})  # the owners opt in
    grid = InProcessGrid(client_app, config, 2, node_configs=allowed)
    with caplog.at_level(logging.WARNING):
        document = run_dpfnas(grid, settings, tmp_path)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any("NO privacy against the server" in r.getMessage() for r in warnings)
    assert document["noise"]["insecure-reproducible-noise"] is True
    assert document["noise"]["private-against-server"] is False
    assert "NO privacy against the server" in document["noise"]["statement"]
    exchanges = [m for m in grid.sent if m.metadata.message_type in (DPFNAS_WEIGHTS, DPFNAS_ARCH)]
    assert exchanges and all(m.content.config_records[CONFIG][INSECURE_KEY] for m in exchanges)


def test_default_is_private_against_the_server(data_cache):
    settings = parse_run_config(tiny_dpfnas(data_cache))
    assert not settings.method_settings.insecure_reproducible_noise
    strategy = DPFNAS(space=build_supernet(settings), settings=settings.method_settings, seed=0)
    noise = strategy.noise_statement()
    assert noise["private-against-server"] is True
    assert noise["insecure-reproducible-noise"] is False
    fnas = parse_run_config(tiny_dpfnas(data_cache, **{"dpfnas.mode": "fnas"}))
    strategy = DPFNAS(space=build_supernet(fnas), settings=fnas.method_settings, seed=0)
    assert strategy.noise_statement()["private-against-server"] is False


@pytest.mark.parametrize("allowed", [None, False, "false"])
def test_a_party_refuses_seeded_noise_unless_its_owner_allows_it(data_cache, caplog, allowed):
    """Without node config allow-reproducible-noise = true, a party refuses every private
    computation asking for seeded noise, saying why; the server books the refusal as that
    node's failure with the reason, and with no party left the search stops, naming it."""
    config = seeded_noise_run(data_cache)
    settings = parse_run_config(config)
    node_configs = {} if allowed is None else {0: {"allow-reproducible-noise": allowed}}
    grid = InProcessGrid(client_app, config, 2, node_configs=node_configs)
    strategy = DPFNAS(space=build_supernet(settings), settings=settings.method_settings, seed=0)
    with caplog.at_level(logging.WARNING), pytest.raises(StageFailedError) as failed:
        strategy.start(grid, ArrayRecord(), 1)
    assert "allow-reproducible-noise = true" in str(failed.value)
    assert strategy.ledger.stage_totals("weights").failed == 2
    for node in grid.node_of_partition.values():
        assert any(
            f"node {node} failed" in r.getMessage() and "has not allowed it" in r.getMessage()
            for r in caplog.records
        )


def test_a_party_whose_owner_allows_it_obeys_while_the_other_refuses(data_cache, caplog):
    config = seeded_noise_run(data_cache)
    settings = parse_run_config(config)
    grid = InProcessGrid(
        client_app, config, 2, node_configs={1: {"allow-reproducible-noise": "true"}}
    )
    strategy = DPFNAS(space=build_supernet(settings), settings=settings.method_settings, seed=0)
    with caplog.at_level(logging.WARNING):
        result = strategy.start(grid, ArrayRecord(), 1)
    assert result.stopped == "completed"
    refuser, obeyer = grid.node_of_partition[0], grid.node_of_partition[1]
    nodes = result.ledger["weights"]["nodes"]
    assert nodes[str(refuser)]["failed"] == 1 and nodes[str(obeyer)].get("failed", 0) == 0
    assert any(f"node {refuser} failed" in r.getMessage() for r in caplog.records)
    assert not any(f"node {obeyer} failed" in r.getMessage() for r in caplog.records)


def test_the_consent_check_itself():
    from fedorasflwr.methods.dpfnas.client import check_noise_consent

    asks = {INSECURE_KEY: True, "noise-multiplier": 1.0}
    with pytest.raises(PermissionError, match="allow-reproducible-noise = true"):
        check_noise_consent(asks, {})
    check_noise_consent(asks, {"allow-reproducible-noise": True})
    check_noise_consent({**asks, INSECURE_KEY: False}, {})  # private noise: nothing to allow
    check_noise_consent({**asks, "noise-multiplier": 0.0}, {})  # no noise at all
    with pytest.raises(ValueError, match="allow-reproducible-noise = 'maybe'"):
        check_noise_consent(asks, {"allow-reproducible-noise": "maybe"})
