"""FDNAS / CFDNAS: aggregation of w and alpha, derivation, the hardware term, bad replies,
and both methods end to end on the in-process grid (real client code, real data)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from torch.utils.data import TensorDataset

from fedorasflwr.client_app import app as client_app
from fedorasflwr.config import parse_run_config
from fedorasflwr.data import ClientData
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.methods.fdnas.client import hardware_loss, rescale_sampled, search_supernet
from fedorasflwr.methods.fdnas.messages import FDNAS_SEARCH
from fedorasflwr.methods.fdnas.runner import cluster_tagger, run_cfdnas
from fedorasflwr.nonce import echo
from fedorasflwr.protocol import ARRAYS, CONFIG, METRICS, space_to_config
from fedorasflwr.search_spaces import build_space
from fedorasflwr.strategies import CFDNAS, FDNAS, FDNASSettings
from tests.runconfig import tiny_fdnas

NUM_NODES = 10


@pytest.fixture(scope="module")
def run_config(data_cache):
    return tiny_fdnas(data_cache)


def make_strategy(config, cls=FDNAS, **overrides):
    settings = parse_run_config(config)
    torch.manual_seed(settings.seed)
    space = build_space("mbconv", width=0.25, layers_per_stage=1)
    return cls(
        space=space,
        settings=settings.method_settings,
        seed=settings.seed,
        cluster_of=cluster_tagger(settings),
        **overrides,
    )


def fake_replies(strategy, messages, alphas_of, sizes):
    """One reply per message: the sent arrays with alphas replaced, and a data size."""
    replies = []
    for index, message in enumerate(messages):
        arrays = ArrayRecord(dict(message.content.array_records[ARRAYS].items()))
        for key in strategy.space.alpha_keys():
            arrays[key] = Array(alphas_of(index, key))
        metrics = MetricRecord(
            {
                "num-examples": sizes[index],
                "train-loss": 1.0,
                "val-loss": 1.0,
                "train-flops": 10,
                "expected-flops": 1.0,
            }
        )
        reply = Message(RecordDict({ARRAYS: arrays, METRICS: metrics}), reply_to=message)
        replies.append(echo(message, reply))
    return replies


def test_averaged_alpha_is_the_data_size_weighted_mean(run_config):
    strategy = make_strategy(run_config)
    grid = InProcessGrid(client_app, run_config, NUM_NODES)
    strategy.setup(grid)
    arrays = ArrayRecord(strategy.space.state_dict())
    messages = list(strategy.configure_train(1, arrays, ConfigRecord(), grid))
    assert {m.metadata.message_type for m in messages} == {FDNAS_SEARCH}
    rng = np.random.default_rng(7)
    alphas = {
        (i, key): rng.normal(size=arrays[key].shape).astype(np.float32)
        for i in range(len(messages))
        for key in strategy.space.alpha_keys()
    }
    # at most what each node declared (num-train + num-val): more is rejected
    honest = min(p.num_train + p.num_val for p in strategy.profiles.values())
    sizes = [int(v) for v in rng.integers(10, honest + 1, size=len(messages))]
    replies = fake_replies(strategy, messages, lambda i, key: alphas[i, key], sizes)
    aggregated, metrics = strategy.aggregate_train(1, replies)
    for key in strategy.space.alpha_keys():
        expected = np.average([alphas[i, key] for i in range(len(messages))], axis=0, weights=sizes)
        np.testing.assert_allclose(aggregated[key].numpy(), expected, rtol=1e-5, atol=1e-6)
    assert metrics["num-examples"] == sum(sizes)


def test_non_finite_alpha_is_dropped_and_the_rest_averaged(run_config, caplog):
    strategy = make_strategy(run_config)
    grid = InProcessGrid(client_app, run_config, NUM_NODES)
    strategy.setup(grid)
    arrays = ArrayRecord(strategy.space.state_dict())
    messages = list(strategy.configure_train(1, arrays, ConfigRecord(), grid))
    key0 = strategy.space.alpha_keys()[0]

    def alphas_of(index, key):
        value = np.full(arrays[key].shape, float(index), dtype=np.float32)
        if index == 0 and key == key0:
            value[0] = np.nan
        return value

    replies = fake_replies(strategy, messages, alphas_of, [1] * len(messages))
    aggregated, metrics = strategy.aggregate_train(1, replies)
    assert metrics["clients"] == len(messages) - 1
    assert np.isfinite(aggregated[key0].numpy()).all()
    np.testing.assert_allclose(aggregated[key0].numpy(), np.mean(range(1, len(messages))))
    node = messages[0].metadata.dst_node_id
    assert f"dropped reply of node {node}" in caplog.text and "non-finite" in caplog.text


def test_strategy_derivation_is_the_argmax_of_the_aggregated_alpha(run_config):
    strategy = make_strategy(run_config)
    state = strategy.space.state_dict()
    expected = []
    for layer, key in enumerate(strategy.space.alpha_keys()):
        values = torch.zeros_like(state[key])
        values[(layer + 2) % len(values)] = 1.0
        state[key] = values
        expected.append((layer + 2) % len(values))
    assert strategy.derive(ArrayRecord(state)) == tuple(expected)


def test_strategy_derivation_keeps_every_net_within_max_flops(run_config):
    plain = make_strategy(run_config)
    state = plain.space.state_dict()
    for key in plain.space.alpha_keys():  # the argmax: the largest option of every layer
        state[key] = torch.zeros_like(state[key])
    for layer, key in enumerate(plain.space.alpha_keys()):
        flops = [plain.space.option_cost(layer, o).flops for o in range(len(state[key]))]
        state[key][int(np.argmax(flops))] = 1.0
    arrays = ArrayRecord(state)
    assert plain.space.cost(plain.derive(arrays)).flops == plain.space.max_flops()
    capped = make_strategy({**run_config, "fdnas.max-flops": 0.6})
    arch = capped.derive(arrays)
    assert capped.space.cost(arch).flops <= 0.6 * capped.space.max_flops()
    with pytest.raises(ValueError, match="'fdnas.max-flops' = 0.01.*cheapest path"):
        make_strategy({**run_config, "fdnas.max-flops": 0.01})


def test_the_rescaling_keeps_the_unsampled_probabilities_of_a_hand_computed_update():
    # p = softmax(log [1, 2, 3, 1]) = [1, 2, 3, 1] / 7; options 1 and 2 were sampled
    alpha = torch.log(torch.tensor([1.0, 2.0, 3.0, 1.0], dtype=torch.float64))
    before = alpha[[1, 2]].clone()
    alpha[1] += 1.0  # the step: +1 and -0.5 on the two sampled logits
    alpha[2] -= 0.5
    rescale_sampled([alpha], [(1, 2)], [before])
    # exp of the sampled pair sums to 2 + 3 again; their ratio is the step's, 2e : 3e^-0.5
    e1, e2 = 2 * np.e, 3 * np.exp(-0.5)
    expected = np.array([1.0, 5 * e1 / (e1 + e2), 5 * e2 / (e1 + e2), 1.0]) / 7
    np.testing.assert_allclose(torch.softmax(alpha, 0).numpy(), expected, rtol=1e-12)
    assert float(alpha[0]) == 0.0 and float(alpha[3]) == 0.0  # unsampled logits untouched


def _search_once(alpha_every: int, epochs: int = 1) -> tuple[list[torch.Tensor], RecordDict]:
    """The alphas before one client's search from a fresh supernet, and its reply."""
    torch.manual_seed(0)
    space = build_space("mbconv", width=0.25, layers_per_stage=1)
    with torch.no_grad():  # distinct logits, so a shift of all of them would show
        for alpha in space.arch_parameters():
            alpha.copy_(torch.linspace(-1.0, 1.0, len(alpha)))
    before = [a.detach().clone() for a in space.arch_parameters()]
    config = {
        "seed": 0,
        "server-round": 1,
        "local-epochs": epochs,
        "batch-size": 32,
        "lr": 0.01,
        "momentum": 0.9,
        "weight-decay": 0.0,
        "alpha-lr": 0.05,
        "alpha-every": alpha_every,
        "target-flops": float(space.min_flops()),
        # CE only: the hardware term's gradient reaches every option through E[FLOPs]
        "hardware-beta": 0.0,
        **space_to_config(space.spec),
    }
    content = RecordDict({ARRAYS: ArrayRecord(space.state_dict()), CONFIG: ConfigRecord(config)})
    return before, search_supernet(content, _synthetic_client(), partition_id=0)


def test_every_two_path_step_keeps_each_layers_softmax_denominator():
    # each step moves two sampled logits and rescales them: logsumexp over the layer holds
    before, reply = _search_once(alpha_every=1)
    state = reply.array_records[ARRAYS].to_torch_state_dict()
    alphas = [v for k, v in state.items() if k.endswith(".alpha")]
    assert any(not torch.equal(a, b) for a, b in zip(alphas, before, strict=True))
    for alpha, old in zip(alphas, before, strict=True):
        assert float(torch.logsumexp(alpha, 0)) == pytest.approx(
            float(torch.logsumexp(old, 0)), abs=1e-5
        )


def test_alphas_stay_frozen_in_the_warm_up_rounds(run_config):
    # the client: alpha-every 0 (what a warm-up round sends) trains w and leaves alpha alone
    before, reply = _search_once(alpha_every=0)
    state = reply.array_records[ARRAYS].to_torch_state_dict()
    alphas = [v for k, v in state.items() if k.endswith(".alpha")]
    assert all(torch.equal(a, b) for a, b in zip(alphas, before, strict=True))
    # the server: rounds 1-2 of 3 warm up, whatever alphas come back
    strategy = make_strategy({**run_config, "fdnas.rounds": 3, "fdnas.warmup-rounds": 2})
    grid = InProcessGrid(client_app, run_config, NUM_NODES)
    strategy.setup(grid)
    arrays = ArrayRecord(strategy.space.state_dict())
    for server_round, frozen in ((1, True), (2, True), (3, False)):
        messages = list(strategy.configure_train(server_round, arrays, ConfigRecord(), grid))
        sent = {int(m.content.config_records[CONFIG]["alpha-every"]) for m in messages}
        assert sent == ({0} if frozen else {strategy.settings.alpha_every})
        replies = fake_replies(
            strategy, messages, lambda i, key: np.ones(arrays[key].shape, np.float32), [1] * 10
        )
        aggregated, _ = strategy.aggregate_train(server_round, replies)
        for key in strategy.space.alpha_keys():
            expected = arrays[key].numpy() if frozen else np.ones(arrays[key].shape)
            np.testing.assert_array_equal(aggregated[key].numpy(), expected)


@pytest.mark.parametrize("clip", [0.0, 1e-3])
def test_a_search_weight_step_is_clipped_at_grad_clip(clip):
    """One weight step (batch 96: the whole split) at lr 0.1 without momentum or weight
    decay: with ``grad-clip`` its L2 norm over w is exactly lr x clip; alphas frozen."""
    torch.manual_seed(0)
    space = build_space("mbconv", width=0.25, layers_per_stage=1)
    before = {k: v.detach().clone() for k, v in space.state_dict().items()}
    config = {
        "seed": 0,
        "server-round": 1,
        "local-epochs": 1,
        "batch-size": 96,
        "lr": 0.1,
        "momentum": 0.0,
        "weight-decay": 0.0,
        "alpha-lr": 0.05,
        "alpha-every": 0,
        "target-flops": float(space.min_flops()),
        "hardware-beta": 0.0,
        **({"grad-clip": clip} if clip else {}),
        **space_to_config(space.spec),
    }
    content = RecordDict({ARRAYS: ArrayRecord(space.state_dict()), CONFIG: ConfigRecord(config)})
    reply = search_supernet(content, _synthetic_client(), partition_id=0)
    state = reply.array_records[ARRAYS].to_torch_state_dict()
    names = {id(p): k for k, p in space.named_parameters()}
    weights = [names[id(p)] for p in space.weight_parameters()]
    step = math.sqrt(sum(float(((state[k] - before[k]) ** 2).sum()) for k in weights))
    if clip:
        assert step == pytest.approx(0.1 * clip, rel=1e-4)
    else:
        assert step > 100 * 0.1 * 1e-3


def test_grad_clip_is_every_stages_and_5_by_default(run_config):
    # 5 (DARTS's value) since mbconv's default head became flatten (issue 40); the paper: none
    settings = FDNASSettings.from_config(run_config)
    assert settings.train.grad_clip == settings.final.grad_clip == 5.0
    assert FDNASSettings().train.grad_clip == 5.0  # the class default is the run config's
    assert settings.train.client_config()["grad-clip"] == 5.0
    assert settings.final.client_config()["grad-clip"] == 5.0
    off = FDNASSettings.from_config({**run_config, "fdnas.grad-clip": 0.0})
    assert off.train.grad_clip == off.final.grad_clip == 0.0
    assert "grad-clip" not in off.train.client_config()  # the paper's messages, unchanged
    assert "grad-clip" not in off.final.client_config()
    with pytest.raises(ValueError, match=r"'fdnas\.grad-clip' = -1\.0.*>= 0"):
        FDNASSettings.from_config({**run_config, "fdnas.grad-clip": -1.0})


def _synthetic_client(seed: int = 0) -> ClientData:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(96, 1, 28, 28, generator=generator)
    y = torch.randint(0, 10, (96,), generator=generator)
    data = TensorDataset(x, y)
    return ClientData(train=data, val=data, test=data, num_classes=10, label_counts=(0,) * 10)


def _expected_flops_after_search(
    beta: float, target: float | None = None, epochs: int = 2
) -> tuple[float, int]:
    """Expected FLOPs and derived-net FLOPs after one client's search from a fresh
    supernet; ``target`` is a fraction of the largest path (default: the smallest path)."""
    torch.manual_seed(0)
    space = build_space("mbconv", width=0.25, layers_per_stage=1)
    absolute = space.min_flops() if target is None else target * space.max_flops()
    config = {
        "seed": 0,
        "server-round": 1,
        "local-epochs": epochs,
        "batch-size": 16,
        "lr": 0.01,
        "momentum": 0.9,
        "weight-decay": 0.0,
        "alpha-lr": 0.05,
        "alpha-every": 1,
        "target-flops": float(absolute),
        "hardware-beta": beta,
        **space_to_config(space.spec),
    }
    content = RecordDict({ARRAYS: ArrayRecord(space.state_dict()), CONFIG: ConfigRecord(config)})
    reply = search_supernet(content, _synthetic_client(), partition_id=0)
    space.load_state_dict(reply.array_records[ARRAYS].to_torch_state_dict())
    return float(reply.metric_records[METRICS]["expected-flops"]), space.cost(space.derive()).flops


def test_the_hardware_term_lowers_the_flops_of_the_derived_net_as_its_weight_rises():
    # Same data, seed and initialisation; only beta differs (Adam on alpha, so the
    # effect saturates once the hardware term dominates the gradient: with ProxylessNAS's
    # rescaling, which undoes its pull on the two sampled options' total, beyond beta ~1).
    results = [_expected_flops_after_search(beta) for beta in (0.0, 0.1, 0.3)]
    expected = [e for e, _ in results]
    derived = [d for _, d in results]
    assert expected[0] > expected[1] > expected[2]
    assert derived[0] > derived[1] >= derived[2]


def test_a_lower_target_gives_a_cheaper_net_and_the_search_settles_near_its_target():
    # Same data, seed, supernet and beta; only the target differs.  The uniform
    # supernet expects ~0.59 of the largest path: 0.75 lies above, 0.35 and 0.2 below.
    space = build_space("mbconv", width=0.25, layers_per_stage=1)
    start = float(space.expected_flops().detach()) / space.max_flops()
    targets = (0.2, 0.35, 0.75)
    results = [_expected_flops_after_search(2.0, target, epochs=4) for target in targets]
    expected = [e / space.max_flops() for e, _ in results]
    derived = [d for _, d in results]
    assert expected[0] < expected[1] < expected[2]
    assert derived[0] <= derived[1] < derived[2]
    for target, value in zip(targets, expected, strict=True):
        # each search moved its expected FLOPs towards its own target, from either side
        assert abs(np.log(value / target)) < abs(np.log(start / target))
    # a target above the supernet pulls it up (a one-sided term would leave CE alone)
    unconstrained, _ = _expected_flops_after_search(0.0, 0.75, epochs=4)
    assert expected[2] > unconstrained / space.max_flops()


def test_the_hardware_loss_is_zero_at_the_target_and_grows_on_both_sides():
    space = build_space("mbconv", width=0.25, layers_per_stage=1)
    expected = float(space.expected_flops().detach())
    assert float(hardware_loss(space, expected, 2.0).detach()) == pytest.approx(0.0, abs=1e-9)
    for scale in (0.5, 2.0):  # log(2)^2 either way
        value = float(hardware_loss(space, expected * scale, 2.0).detach())
        assert value == pytest.approx(2.0 * np.log(2.0) ** 2, rel=1e-4)
    near, far = (float(hardware_loss(space, expected / s, 2.0).detach()) for s in (1.2, 1.5))
    assert 0.0 < near < far


def test_the_hardware_gradient_pushes_alpha_towards_cheaper_options():
    space = build_space("mbconv", width=0.25, layers_per_stage=1)
    hardware_loss(space, float(space.min_flops()), 1.0).backward()
    for layer, alpha in enumerate(space.arch_parameters()):
        flops = torch.tensor([float(space.option_cost(layer, o).flops) for o in range(len(alpha))])
        mean = float(flops.mean())
        # gradient descent lowers the logits of options costlier than the expectation
        assert torch.all((alpha.grad > 0) == (flops > mean))


def test_clusters_follow_the_class_groups(run_config):
    strategy = make_strategy(run_config)
    strategy.setup(InProcessGrid(client_app, run_config, NUM_NODES))
    assert strategy.cluster_of_partition == {
        p: 0 if p < 3 else 1 if p < 6 else 2 for p in range(10)
    }


def test_a_declared_cluster_tag_wins(run_config):
    strategy = make_strategy(run_config)
    grid = InProcessGrid(
        client_app, run_config, NUM_NODES, node_configs={p: {"cluster": p % 2} for p in range(10)}
    )
    strategy.setup(grid)
    assert strategy.cluster_of_partition == {p: p % 2 for p in range(10)}


def test_cfdnas_end_to_end_gives_one_net_per_cluster(run_config, tmp_path):
    settings = parse_run_config({**run_config, "method": "cfdnas"})
    grid = InProcessGrid(client_app, run_config, NUM_NODES)
    document = run_cfdnas(grid, settings, tmp_path)
    names = [net["name"] for net in document["nets"]]
    assert names == ["fdnas", "cluster-0", "cluster-1", "cluster-2"]
    assert document["nets"][0]["partitions"] == list(range(10))
    assert document["nets"][1]["partitions"] == [0, 1, 2]
    for net in document["nets"]:
        assert 0.0 <= net["averaged-accuracy"] <= 1.0
        assert 0.0 <= net["mean-local-accuracy"] <= 1.0
    assert set(document["cluster-history"]) == {0, 1, 2}
    assert "cluster-0" in document["ledger"] and "search" in document["ledger"]
    assert (tmp_path / "cluster-2.pt").exists()


def test_naive_cfdnas_searches_each_cluster_from_a_fresh_supernet(run_config):
    strategy = make_strategy(run_config, cls=CFDNAS, inherit=False, train_global=False)
    grid = InProcessGrid(client_app, run_config, NUM_NODES)
    result = strategy.start(grid, ArrayRecord(), num_rounds=strategy.settings.train.rounds)
    assert result.search_history == []
    assert [net.name for net in result.nets] == ["cluster-0", "cluster-1", "cluster-2"]
