"""DP-FNAS end to end on the in-process grid: real client code, real MNIST-5k, tiny darts."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, RecordDict
from opacus.accountants import RDPAccountant

from fedorasflwr.client_app import app as client_app
from fedorasflwr.config import parse_run_config
from fedorasflwr.inprocess import InProcessGrid, replace_content
from fedorasflwr.methods.dpfnas.contract import DPFNAS_WEIGHTS
from fedorasflwr.methods.dpfnas.privacy import epsilon
from fedorasflwr.methods.dpfnas.strategy import DPFNAS
from fedorasflwr.packing import unpack_content
from fedorasflwr.protocol import ARRAYS, METRICS
from fedorasflwr.runs import build_supernet
from fedorasflwr.search_spaces.darts import DartsSpace, Genotype
from tests.runconfig import pyproject_run_config


def tiny_dpfnas(cache_dir, **overrides):
    config = pyproject_run_config()
    config.update(
        {
            "method": "dpfnas",
            "data.cache-dir": str(cache_dir),
            "onnx": False,  # ONNX export has its own tests
            "data.partitioner": "iid",
            "space.name": "darts",
            "space.width": 0.25,
            "space.layers-per-block": 2,
            "dpfnas.iterations": 2,
            "dpfnas.batch-size": 8,
            "dpfnas.eval-every": 0,
            "dpfnas.final-rounds": 1,
            "min-nodes": 1,
        }
    )
    config.update(overrides)
    return config


def small_dpfnas(cache_dir, **overrides):
    """``tiny_dpfnas`` with one darts cell: what this module's claims need (the cell's
    mixed ops are most of a search's CPU, the second-order gradient's above all)."""
    return tiny_dpfnas(cache_dir, **{"space.layers-per-block": 1, **overrides})


def run(config, num_nodes=2, faults=None, node_configs=None):
    settings = parse_run_config(config)
    grid = InProcessGrid(client_app, config, num_nodes, faults=faults, node_configs=node_configs)
    strategy = DPFNAS(
        space=build_supernet(settings), settings=settings.method_settings, seed=settings.seed
    )
    return strategy, grid, strategy.start(grid, ArrayRecord(), settings.method_settings.iterations)


@pytest.fixture(scope="module")
def finished(data_cache):
    return run(small_dpfnas(data_cache))


def test_search_derive_train_and_report(finished):
    strategy, grid, result = finished
    assert result.iterations == 2 and result.stopped == "completed"
    assert [h["iteration"] for h in result.history] == [0, 1, 2]
    assert Genotype.from_text(result.genotype.to_text()) == result.genotype
    assert 0.0 <= result.test_accuracy <= 1.0
    assert {"weights", "arch", "final"} <= set(result.ledger)
    weights = [m for m in grid.sent if m.metadata.message_type == DPFNAS_WEIGHTS]
    assert len(weights) == 2 * 2
    # the architecture variables moved, the weights moved
    initial = ArrayRecord(build_supernet(parse_run_config(small_dpfnas("-"))).state_dict())
    for key in DartsSpace.ARCH_KEYS + ("net.classifier.weight",):
        assert not np.allclose(result.arrays[key].numpy(), initial[key].numpy())


def test_reported_epsilon_is_opacus_for_the_same_mechanism(finished):
    strategy, _, result = finished
    assert len(result.privacy) == 2
    for party, profile in zip(result.privacy, strategy.parties, strict=True):
        rate_val = 8 / profile.num_val
        assert party.architecture.sample_rate == pytest.approx(rate_val)
        assert party.architecture.steps == 2
        assert party.architecture.epsilon == pytest.approx(epsilon(1.0, rate_val, 2, 1e-5))
        assert party.weights.sample_rate == pytest.approx(8 / profile.num_train)
        assert party.epsilon == max(party.weights.epsilon, party.architecture.epsilon)
    assert result.history[-1]["epsilon"] == max(p.epsilon for p in result.privacy)


def test_same_seed_same_search_only_with_insecure_reproducible_noise(finished, data_cache):
    """Private noise comes from each party's OS CSPRNG: only the insecure key reproduces it."""
    insecure = {"dpfnas.final-rounds": 0, "dpfnas.insecure-reproducible-noise": True}
    allowed = dict.fromkeys(range(2), {"allow-reproducible-noise": True})  # the owners opt in
    _, _, first = run(small_dpfnas(data_cache, **insecure), node_configs=allowed)
    _, _, again = run(small_dpfnas(data_cache, **insecure), node_configs=allowed)
    for key in DartsSpace.ARCH_KEYS:
        np.testing.assert_array_equal(again.arrays[key].numpy(), first.arrays[key].numpy())
    assert any(  # the default (secure) run of the same seed drew other noise
        not np.array_equal(first.arrays[k].numpy(), finished[2].arrays[k].numpy())
        for k in DartsSpace.ARCH_KEYS
    )


def test_privacy_target_stops_the_search(data_cache, caplog):
    config = small_dpfnas(
        data_cache,
        **{"dpfnas.target-epsilon": 1.46, "dpfnas.iterations": 5, "dpfnas.final-rounds": 0},
    )
    with caplog.at_level(logging.WARNING):
        _, _, result = run(config)
    assert 0 < result.iterations < 5
    assert result.stopped.startswith("privacy target reached")
    assert result.iterations == 1
    assert max(p.epsilon for p in result.privacy) <= 1.46
    assert "privacy target reached" in caplog.text


def test_malformed_gradient_is_dropped_and_logged(data_cache, caplog):
    def poison(reply):
        if reply.has_error() or reply.metadata.message_type != DPFNAS_WEIGHTS:
            return reply
        arrays = reply.content.array_records[ARRAYS]
        bad = ArrayRecord({k: Array(np.full_like(v.numpy(), np.nan)) for k, v in arrays.items()})
        metrics = reply.content.metric_records[METRICS]
        return replace_content(reply, RecordDict({ARRAYS: bad, METRICS: metrics}))

    config = small_dpfnas(data_cache, **{"dpfnas.iterations": 1, "dpfnas.final-rounds": 0})
    with caplog.at_level(logging.WARNING):
        strategy, grid, result = run(config, faults={1: poison})
    node = grid.node_of_partition[1]
    assert f"dropped reply of node {node}: key" in caplog.text
    assert "non-finite" in caplog.text
    assert result.history[-1]["weights-parties"] == 1
    assert result.ledger["weights"]["totals"]["rejected"] == 1
    assert all(np.isfinite(v.numpy()).all() for v in result.arrays.values())


def test_final_training_privacy(finished, data_cache):
    # non-private final training: the training split's epsilon is honestly infinite
    assert all(math.isinf(p["training-split-epsilon"]) for p in finished[2].final_privacy)
    config = small_dpfnas(
        data_cache,
        **{"dpfnas.iterations": 1, "dpfnas.final-noise": 1.0, "dpfnas.final-batch-size": 256},
    )
    strategy, _, result = run(config)
    assert 0.0 <= result.test_accuracy <= 1.0
    for report, party in zip(result.final_privacy, strategy.parties, strict=True):
        rate_final = 256 / party.num_train
        steps = -(-party.num_train // 256)
        accountant = RDPAccountant()
        for _ in range(steps):
            accountant.step(noise_multiplier=1.0, sample_rate=rate_final)
        accountant.step(noise_multiplier=1.0, sample_rate=8 / party.num_train)
        assert report["final-steps"] == steps
        assert report["training-split-epsilon"] == pytest.approx(accountant.get_epsilon(1e-5))


def test_second_order_search_sends_the_previous_weights(data_cache):
    """order 2: every arch exchange carries W before that iteration's W step
    (``previous.<key>``), which is what Eq. 5's W+- are built around."""
    from fedorasflwr.methods.dpfnas.contract import DPFNAS_ARCH, PREVIOUS_PREFIX

    config = small_dpfnas(data_cache, **{"dpfnas.order": 2, "dpfnas.final-rounds": 0})
    strategy, grid, result = run(config)
    assert result.iterations == 2 and result.stopped == "completed"
    weights = [m for m in grid.sent if m.metadata.message_type == DPFNAS_WEIGHTS]
    arch = [m for m in grid.sent if m.metadata.message_type == DPFNAS_ARCH]
    assert len(weights) == len(arch) == 4  # 2 iterations x 2 parties
    for w_message, a_message in zip(weights, arch, strict=True):
        # as the ClientApp reads them (on the wire they are packed)
        sent_w = unpack_content(w_message.content).array_records[ARRAYS]
        sent_a = unpack_content(a_message.content).array_records[ARRAYS]
        assert a_message.content.config_records["config"]["order"] == 2
        for key in strategy.weight_keys:
            np.testing.assert_array_equal(
                sent_a[PREVIOUS_PREFIX + key].numpy(), sent_w[key].numpy()
            )
        # the arch message's own W is the stepped one: the W step happened in between
        assert any(
            not np.array_equal(sent_a[k].numpy(), sent_w[k].numpy()) for k in strategy.weight_keys
        )


def test_batch_larger_than_a_split_is_warned(data_cache, caplog):
    """Many parties -> tiny validation splits: a rate capped at 1 is logged (huge epsilon)."""
    config = small_dpfnas(data_cache, **{"dpfnas.final-rounds": 0, "dpfnas.batch-size": 8})

    def set_up(config):  # the warning comes from setup: no search needed
        settings = parse_run_config(config)
        space = build_supernet(settings)
        strategy = DPFNAS(space=space, settings=settings.method_settings, seed=settings.seed)
        strategy.setup(InProcessGrid(client_app, config, 20))
        return strategy

    with caplog.at_level(logging.WARNING):
        strategy = set_up(config)
    smallest = min(p.num_val for p in strategy.parties)
    assert smallest <= 25  # MNIST-5k over 20 parties: ~22 validation digits each
    assert "sample rate is capped at 1" not in caplog.text  # 8 < 22: still subsampled
    caplog.clear()
    config["dpfnas.batch-size"] = smallest
    with caplog.at_level(logging.WARNING):
        strategy = set_up(config)
    assert "sample rate is capped at 1" in caplog.text
    assert max(strategy.sample_rates(p)[1] for p in strategy.parties) == 1.0


def test_server_data_gives_the_default_validation_of_the_mixed_supernet(data_cache):
    from torch.utils.data import DataLoader

    from fedorasflwr.data import load_server_data
    from fedorasflwr.methods.dpfnas.evaluation import MixedSupernetEvaluator
    from fedorasflwr.training import evaluate, torch_device

    settings = parse_run_config(small_dpfnas(data_cache, **{"dpfnas.eval-every": 1}))
    server_data = load_server_data(settings.data)
    space = build_supernet(settings)
    strategy = DPFNAS(
        space=space, settings=settings.method_settings, seed=0, server_data=server_data
    )
    assert isinstance(strategy.evaluate_fn, MixedSupernetEvaluator)
    assert DPFNAS(space=space, settings=settings.method_settings, seed=0).evaluate_fn is None
    metrics = strategy.evaluate_fn(1, ArrayRecord(space.state_dict()))
    space.eval()  # what the project's runner computed itself before
    expected = evaluate(space, DataLoader(server_data, batch_size=256), torch_device())
    assert metrics["val-accuracy"] == expected.accuracy
    assert metrics["val-loss"] == pytest.approx(expected.loss)
