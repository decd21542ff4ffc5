"""FedNAS: the FedAvg of the weights *and* the alphas (not client 0's alphas, as FedML's
server keeps), the client's local DARTS steps, bad replies, settings, and the method end to
end on the in-process grid (real client code, real data)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fedorasflwr.client_app import app as client_app
from fedorasflwr.config import parse_run_config
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.methods.fednas.client import search_supernet
from fedorasflwr.methods.fednas.messages import FEDNAS_SEARCH
from fedorasflwr.methods.fednas.strategy import alpha_entropy, genotype_cost
from fedorasflwr.nonce import echo
from fedorasflwr.protocol import ARRAYS, CONFIG, METRICS, space_to_config
from fedorasflwr.search_spaces import build_space
from fedorasflwr.search_spaces.darts_style import build_derived_network, network_flops
from fedorasflwr.strategies import FedNAS, FedNASSettings
from fedorasflwr.training import has_batchnorm
from tests.runconfig import tiny_fednas

NUM_NODES = 3
ALPHA = "net.alpha_reduce"


@pytest.fixture(scope="module")
def run_config(data_cache):
    return tiny_fednas(data_cache)


def make_strategy(config):
    settings = parse_run_config(config)
    torch.manual_seed(settings.seed)
    space = build_space(
        "darts", channels=2, cells=1, input_height=28, input_width=28, stem_stride=2
    )
    return FedNAS(space=space, settings=settings.method_settings, seed=settings.seed)


def reply_to(message, arrays, n, **metrics):
    content = RecordDict(
        {
            ARRAYS: arrays,
            METRICS: MetricRecord(
                {
                    "num-examples": n,
                    "train-loss": 1.0,
                    "val-loss": 1.0,
                    "train-flops": 0,
                    **metrics,
                }
            ),
        }
    )
    return echo(message, Message(content, reply_to=message))


def setup(run_config):
    strategy = make_strategy(run_config)
    grid = InProcessGrid(client_app, run_config, NUM_NODES)
    strategy.setup(grid)
    arrays = ArrayRecord(strategy.space.state_dict())
    messages = list(strategy.configure_train(1, arrays, ConfigRecord(), grid))
    return strategy, arrays, messages


def test_the_alphas_and_weights_are_the_sample_weighted_mean_not_client_0s(run_config):
    strategy, arrays, messages = setup(run_config)
    assert {m.metadata.message_type for m in messages} == {FEDNAS_SEARCH}
    assert len(messages) == NUM_NODES  # clients-per-round 0: every client
    by_partition = sorted(
        messages, key=lambda m: strategy.profiles[m.metadata.dst_node_id].partition_id
    )
    shape = arrays[ALPHA].shape
    weight_key = next(k for k in arrays.keys() if k not in strategy.space.arch_keys)
    # client k sends alpha = k + 1 everywhere (k in partition order), and weights 10 (k + 1)
    sizes = [1, 2, 5]
    replies = []
    for k, message in enumerate(by_partition):
        sent = ArrayRecord(dict(message.content.array_records[ARRAYS].items()))
        for key in strategy.space.arch_keys:
            sent[key] = Array(np.full(shape, float(k + 1), dtype=np.float32))
        sent[weight_key] = Array(np.full(arrays[weight_key].shape, 10.0 * (k + 1), np.float32))
        replies.append(reply_to(message, sent, sizes[k]))
    aggregated, metrics = strategy.aggregate_train(1, reversed(replies))  # order of arrival
    # by hand: (1 x 1 + 2 x 2 + 5 x 3) / 8 = 20 / 8 = 2.5; client 0's would be 1
    for key in strategy.space.arch_keys:
        np.testing.assert_allclose(aggregated[key].numpy(), np.full(shape, 2.5), rtol=1e-6)
    np.testing.assert_allclose(aggregated[weight_key].numpy(), 25.0, rtol=1e-6)
    assert metrics["num-examples"] == 8 and metrics["clients"] == 3


def test_a_reply_without_the_alphas_or_with_a_nan_is_dropped_and_the_rest_averaged(
    run_config, caplog
):
    strategy, arrays, messages = setup(run_config)
    by_partition = sorted(
        messages, key=lambda m: strategy.profiles[m.metadata.dst_node_id].partition_id
    )
    shape = arrays[ALPHA].shape
    replies = []
    for k, message in enumerate(by_partition):
        sent = ArrayRecord(dict(message.content.array_records[ARRAYS].items()))
        sent[ALPHA] = Array(np.full(shape, float(k), dtype=np.float32))
        if k == 0:
            del sent[ALPHA]  # no alphas
        if k == 1:
            bad = np.full(shape, 1.0, dtype=np.float32)
            bad[0, 0] = np.nan
            sent[ALPHA] = Array(bad)
        replies.append(reply_to(message, sent, 4))
    aggregated, metrics = strategy.aggregate_train(1, replies)
    assert metrics["clients"] == 1
    np.testing.assert_allclose(aggregated[ALPHA].numpy(), 2.0)
    dropped = [r.getMessage() for r in caplog.records if "dropped reply" in r.getMessage()]
    assert len(dropped) == 2, dropped


def test_the_client_moves_the_alphas_and_reports_its_training_samples(client_data):
    torch.manual_seed(0)
    space = build_space(
        "darts", channels=2, cells=1, input_height=28, input_width=28, stem_stride=2
    )
    before = {k: v.clone() for k, v in space.state_dict().items()}
    config = {
        "seed": 0,
        "server-round": 1,
        "local-epochs": 1,
        "batch-size": 32,
        "lr": 0.05,
        "momentum": 0.9,
        "weight-decay": 0.0,
        "arch-lr": 0.05,
        "arch-weight-decay": 0.0,
        "mixed-flops": 1,
        **space_to_config(space.spec),
    }
    content = RecordDict({ARRAYS: ArrayRecord(space.state_dict()), CONFIG: ConfigRecord(config)})
    reply = search_supernet(content, client_data, partition_id=0)
    state = reply.array_records[ARRAYS].to_torch_state_dict()
    assert set(state) == set(before)
    assert not torch.equal(state[ALPHA], before[ALPHA])
    assert not torch.equal(state["net.classifier.weight"], before["net.classifier.weight"])
    assert int(reply.metric_records[METRICS]["num-examples"]) == len(client_data.train)


@pytest.mark.parametrize("clip", [0.0, 1e-3])
def test_the_clients_weight_step_is_clipped_at_grad_clip(client_data, clip):
    """One weight step (a batch above the training split) at lr 0.1 without momentum: with
    ``grad-clip`` its L2 norm over the weights is exactly lr x clip (DARTS's clip_grad_norm_);
    without it the step is far larger. The alphas' Adam step is not clipped."""
    torch.manual_seed(0)
    space = build_space(
        "darts", channels=2, cells=1, input_height=28, input_width=28, stem_stride=2
    )
    before = {k: v.clone() for k, v in space.state_dict().items()}
    config = {
        "seed": 0,
        "server-round": 1,
        "local-epochs": 1,
        "batch-size": 10 * len(client_data.train),
        "lr": 0.1,
        "momentum": 0.0,
        "weight-decay": 0.0,
        "arch-lr": 0.05,
        "arch-weight-decay": 0.0,
        "mixed-flops": 1,
        **({"grad-clip": clip} if clip else {}),
        **space_to_config(space.spec),
    }
    content = RecordDict({ARRAYS: ArrayRecord(space.state_dict()), CONFIG: ConfigRecord(config)})
    state = search_supernet(content, client_data, 0).array_records[ARRAYS].to_torch_state_dict()
    weights = [k for k, p in space.named_parameters() if k not in space.arch_keys]
    step = math.sqrt(sum(float(((state[k] - before[k]) ** 2).sum()) for k in weights))
    if clip:
        assert step == pytest.approx(0.1 * clip, rel=1e-4)
    else:
        assert step > 100 * 0.1 * 1e-3
    assert not torch.equal(state[ALPHA], before[ALPHA])


def test_both_stages_clip_at_5_by_default_and_send_it(run_config):
    settings = FedNASSettings.from_config(run_config)
    assert settings.search.grad_clip == settings.final.grad_clip == 5.0
    assert settings.search.client_config()["grad-clip"] == 5.0
    assert settings.final.client_config()["grad-clip"] == 5.0
    off = FedNASSettings.from_config(
        {**run_config, "fednas.grad-clip": 0.0, "fednas.final-grad-clip": 2.5}
    )
    assert "grad-clip" not in off.search.client_config()
    assert off.final.client_config()["grad-clip"] == 2.5
    _, _, messages = setup(run_config)
    assert {m.content.config_records[CONFIG]["grad-clip"] for m in messages} == {5.0}


def every_op_flops(space):
    """The mixed supernet's per-sample forward FLOPs by hand: the fixed part plus every
    option of every layer (a DARTS edge runs all of its ops)."""
    options = space.num_options()
    return space.fixed_cost.flops + sum(
        space.option_cost(layer, o).flops
        for layer in range(len(options))
        for o in range(options[layer])
    )


def test_the_client_books_3x_mixed_flops_per_sample_of_both_steps(client_data):
    """train-flops = 3 x mixed-flops x (training samples of the weight steps + validation
    samples of the architecture steps), the validation loader cycling across epochs."""
    torch.manual_seed(0)
    space = build_space(
        "darts", channels=2, cells=1, input_height=28, input_width=28, stem_stride=2
    )
    batch, epochs = 32, 2
    config = {
        "seed": 0,
        "server-round": 1,
        "local-epochs": epochs,
        "batch-size": batch,
        "lr": 0.05,
        "momentum": 0.9,
        "weight-decay": 0.0,
        "arch-lr": 0.05,
        "arch-weight-decay": 0.0,
        "mixed-flops": 1000,
        **space_to_config(space.spec),
    }
    content = RecordDict({ARRAYS: ArrayRecord(space.state_dict()), CONFIG: ConfigRecord(config)})
    reply = search_supernet(content, client_data, partition_id=0)
    n_train, n_val = len(client_data.train), len(client_data.val)
    assert n_val > 0 and n_train % batch and n_val % batch  # partial batches on both sides
    steps = epochs * -(-n_train // batch)
    val_batches = [batch] * (n_val // batch) + [n_val % batch]
    val_seen = sum(val_batches[i % len(val_batches)] for i in range(steps))
    spent = reply.metric_records[METRICS]["train-flops"]
    assert isinstance(spent, int)
    assert spent == 3 * 1000 * (epochs * n_train + val_seen)


def test_the_search_instruction_carries_the_mixed_supernets_forward_flops(run_config):
    strategy, _, messages = setup(run_config)
    expected = every_op_flops(strategy.space)
    assert strategy.mixed_flops == expected > strategy.space.max_flops()
    assert {m.content.config_records[CONFIG]["mixed-flops"] for m in messages} == {expected}


def test_the_ledger_books_the_sum_of_the_replies_train_flops(run_config):
    strategy, _, messages = setup(run_config)
    spent = [3 * 7, 3 * 11, 3 * 13]
    by_partition = sorted(
        messages, key=lambda m: strategy.profiles[m.metadata.dst_node_id].partition_id
    )
    replies = [
        reply_to(
            m, ArrayRecord(dict(m.content.array_records[ARRAYS].items())), 4, **{"train-flops": f}
        )
        for m, f in zip(by_partition, spent, strict=True)
    ]
    strategy.aggregate_train(1, replies)
    for message, flops in zip(by_partition, spent, strict=True):
        assert strategy.ledger.node("search", message.metadata.dst_node_id).train_flops == flops
    assert strategy.ledger.stage_totals("search").train_flops == sum(spent) == 93


@pytest.mark.parametrize(
    ("flops", "reason"),
    [
        (-3, "metric 'train-flops' is negative"),
        (float("nan"), "metric 'train-flops' is not finite"),
        (None, "metric 'train-flops' missing"),
        (2.5, "metric 'train-flops' = 2.5 is not a whole number"),
        (10**18, "metric 'train-flops' = 1000000000000000000 exceeds"),
    ],
    ids=["negative", "nan", "missing", "fraction", "above-bound"],
)
def test_a_reply_with_a_bad_train_flops_is_dropped_naming_the_node(
    run_config, caplog, flops, reason
):
    strategy, _, messages = setup(run_config)
    by_partition = sorted(
        messages, key=lambda m: strategy.profiles[m.metadata.dst_node_id].partition_id
    )
    replies = []
    for k, message in enumerate(by_partition):
        sent = ArrayRecord(dict(message.content.array_records[ARRAYS].items()))
        reply = reply_to(message, sent, 4, **{"train-flops": 30})
        if k == 1:
            metrics = reply.content.metric_records[METRICS]
            if flops is None:
                del metrics["train-flops"]
            else:
                metrics["train-flops"] = flops
        replies.append(reply)
    _, metrics = strategy.aggregate_train(1, replies)
    bad = by_partition[1].metadata.dst_node_id
    assert metrics["clients"] == 2
    assert f"dropped reply of node {bad}: {reason}" in caplog.text
    assert strategy.ledger.node("search", bad).train_flops == 0
    assert strategy.ledger.node("search", bad).rejected == 1
    assert strategy.ledger.stage_totals("search").train_flops == 60


def test_alpha_entropy_is_ln_options_when_uniform_and_falls_when_decided():
    space = build_space(
        "darts", channels=2, cells=1, input_height=28, input_width=28, stem_stride=2
    )
    with torch.no_grad():
        space.net.alpha_normal.zero_()
        space.net.alpha_reduce.zero_()
        space.net.alpha_reduce[:, 4] = 50.0
    entropy = alpha_entropy(space)
    assert entropy["net.alpha_normal"] == pytest.approx(math.log(8), abs=1e-5)
    assert entropy["net.alpha_reduce"] == pytest.approx(0.0, abs=1e-5)


def test_the_genotypes_cost_is_its_path_in_the_supernet():
    space = build_space(
        "darts", channels=2, cells=3, input_height=28, input_width=28, stem_stride=2
    )
    genotype = space.genotype()
    cost = genotype_cost(space, genotype)
    assert space.min_flops() <= cost <= space.max_flops()


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [
        ("fednas.rounds", 0, ">= 1"),
        ("fednas.arch-lr", 0.0, "> 0"),
        ("fednas.weight-momentum", 1.0, "0 <= m < 1"),
        ("fednas.final-clients-per-round", -1, ">= 0"),
        ("fednas.grad-clip", -1.0, ">= 0 (0: no clipping)"),
        ("fednas.final-grad-clip", -1.0, ">= 0 (0: no clipping)"),
    ],
)
def test_a_bad_setting_is_refused_naming_the_key(run_config, key, value, allowed):
    with pytest.raises(ValueError, match=key) as error:
        FedNASSettings.from_config({**run_config, key: value})
    assert allowed in str(error.value)


def test_fednas_end_to_end(run_config, tmp_path):
    from fedorasflwr.methods.fednas.runner import run_fednas

    config = {**run_config, "output-dir": str(tmp_path)}
    settings = parse_run_config(config)
    document = run_fednas(InProcessGrid(client_app, config, NUM_NODES), settings, tmp_path)
    assert document["rounds"] == 1 and len(document["alpha-entropy"]) == 1
    assert 0.0 <= document["test-accuracy"] <= 1.0
    assert document["macs"] == pytest.approx(document["flops"] / 2)
    assert "|" in document["genotype"]


def test_the_ledger_books_both_stages_exactly(run_config):
    """End to end, the ledger's FLOPs by hand from the profiles: the search (1 round, 1
    epoch, batch 64) at 3 x mixed-flops per training and validation sample, the final
    round (1 epoch) at 3 x net-flops per training sample plus, for a net with BatchNorm,
    1 x net-flops per sample of the BatchNorm refresh."""
    strategy = make_strategy(run_config)
    grid = InProcessGrid(client_app, run_config, NUM_NODES)
    result = strategy.start(grid, ArrayRecord(), 1)
    derived = build_derived_network(strategy.space.spec, result.genotype.to_text())
    refresh = 1 if has_batchnorm(derived) else 0
    assert network_flops(derived, strategy.space) == result.flops
    batch = 64
    search, final = 0, 0
    for profile in strategy.profiles.values():
        steps = -(-profile.num_train // batch)
        val_batches = [batch] * (profile.num_val // batch) + [profile.num_val % batch]
        val_batches = [b for b in val_batches if b]
        val_seen = sum(val_batches[i % len(val_batches)] for i in range(steps))
        search += 3 * strategy.mixed_flops * (profile.num_train + val_seen)
        final += (3 + refresh) * result.flops * profile.num_train
    assert result.ledger["search"]["totals"]["train_flops"] == search
    assert result.ledger["final"]["totals"]["train_flops"] == final
