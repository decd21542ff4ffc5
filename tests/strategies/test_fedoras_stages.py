"""FedorAS Stages 2 and 3 on the in-process grid: the NSGA-II search per tier, federated
path scoring, tier-restricted fine-tuning, rand-init, OPA vs FedAvg, resume."""

from __future__ import annotations

import logging
import math
import re
from dataclasses import replace

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fedorasflwr.artifacts import save_checkpoint
from fedorasflwr.client_app import app as client_app
from fedorasflwr.config import parse_run_config
from fedorasflwr.data import load_server_data
from fedorasflwr.federation.fedavg import cosine_lr, step_lr
from fedorasflwr.inprocess import InProcessGrid, replace_content
from fedorasflwr.methods.fedoras.finetune import SUPERNET_INIT, initial_subnet
from fedorasflwr.methods.fedoras.messages import (
    FEDORAS_EVALUATE,
    FEDORAS_PATHS,
    FEDORAS_SUPERNET,
    FEDORAS_TRAIN,
)
from fedorasflwr.methods.fedoras.runner import resume_supernet, tier_entries
from fedorasflwr.methods.fedoras.scoring import FederatedPathScorer, covering_subspace
from fedorasflwr.methods.fedoras.search import kendall_tau, search_tier
from fedorasflwr.methods.fedoras.strategy import FedorAS
from fedorasflwr.methods.fedoras.tiers import Tier
from fedorasflwr.nonce import nonce_of
from fedorasflwr.packing import unpack_content
from fedorasflwr.protocol import ARRAYS, METRICS
from fedorasflwr.results import result_json
from fedorasflwr.runs import build_supernet, describe_space
from fedorasflwr.search_spaces import build_space
from fedorasflwr.training import evaluate
from tests.runconfig import FEW_ROWS, tiny_fedoras

NUM_NODES = 12


@pytest.fixture(scope="module")
def run_config(data_cache):
    # batches of 64, not 32, and 64 rows per client (FEW_ROWS): a few local steps; no claim
    # here is about the batch size, the data's size or the accuracy reached
    return tiny_fedoras(
        data_cache,
        **{"fedoras.batch-size": 64, "fedoras.finetune-batch-size": 64, **FEW_ROWS},
    )


def make_strategy(config, **overrides):
    settings = parse_run_config(config)
    overrides.setdefault("server_data", load_server_data(settings.data))
    return FedorAS(
        space=build_supernet(settings),
        settings=settings.method_settings,
        seed=settings.seed,
        **overrides,
    )


def run(config, faults=None, stop_after="finetune", initial_arrays=None, **overrides):
    grid = InProcessGrid(client_app, config, NUM_NODES, faults=faults)
    strategy = make_strategy(config, **overrides)
    strategy.settings = replace(strategy.settings, stop_after=stop_after)
    arrays = ArrayRecord() if initial_arrays is None else initial_arrays
    return strategy, grid, strategy.start(grid, arrays, num_rounds=strategy.settings.train.rounds)


@pytest.fixture(scope="module")
def three_stages(run_config):
    return run(run_config)


# --- the search on its own, with a known score ---------------------------------------


def small_space():
    return build_space(
        "cnn_s", num_classes=10, in_channels=1, input_height=28, input_width=28, width=0.25
    )


def middle_tier(space):
    lo, hi = space.min_flops(), space.max_flops()
    return Tier(index=1, low=lo + 0.3 * (hi - lo), high=lo + 0.6 * (hi - lo))


def fake_accuracy(space):
    """A deterministic score that prefers larger option indices."""
    top = sum(n - 1 for n in space.num_options())
    return lambda paths: [sum(p) / top for p in paths]


def test_search_is_deterministic_and_its_choice_lies_in_the_tier():
    space = small_space()
    tier = middle_tier(space)
    runs = [
        search_tier(
            space,
            tier,
            fake_accuracy(space),
            seed=3,
            population=8,
            offspring=4,
            evaluations=24,
        )
        for _ in range(2)
    ]
    assert runs[0].best == runs[1].best
    assert [s.path for s in runs[0].evaluated] == [s.path for s in runs[1].evaluated]
    assert tier.contains(space.cost(runs[0].best).flops)
    assert len(runs[0].evaluated) >= 24
    feasible = [s for s in runs[0].evaluated if s.feasible]
    assert runs[0].best_accuracy == max(s.accuracy for s in feasible)
    other = search_tier(
        space, tier, fake_accuracy(space), seed=4, population=8, offspring=4, evaluations=24
    )
    assert [s.path for s in other.evaluated] != [s.path for s in runs[0].evaluated]


def test_search_improves_on_its_first_generation():
    space = small_space()
    tier = middle_tier(space)
    found = search_tier(
        space, tier, fake_accuracy(space), seed=0, population=8, offspring=8, evaluations=64
    )
    first = max(s.accuracy for s in found.evaluated if s.generation == 0 and s.feasible)
    assert found.best_accuracy > first


def test_the_cost_objective_can_be_parameters():
    space = small_space()
    found = search_tier(
        space,
        middle_tier(space),
        fake_accuracy(space),
        seed=0,
        population=4,
        offspring=2,
        evaluations=8,
        objective="params",
    )
    assert found.evaluated
    with pytest.raises(ValueError, match="objective"):
        search_tier(
            space,
            middle_tier(space),
            fake_accuracy(space),
            seed=0,
            population=4,
            offspring=2,
            evaluations=8,
            objective="latency",
        )


def test_covering_subspace_is_the_union_of_the_options_used():
    assert covering_subspace([(0, 2, 1), (1, 2, 1), (0, 0, 1)], 3) == ((0, 1), (0, 2), (1,))


def test_kendall_tau_by_hand():
    # pairs: (1,2) concordant, (1,3) concordant, (2,3) discordant -> (2 - 1) / 3
    assert kendall_tau([0.1, 0.2, 0.3], [0.1, 0.3, 0.2]) == pytest.approx(1 / 3)
    assert kendall_tau([0.5], [0.5]) is None


def test_cosine_learning_rate_by_hand():
    assert cosine_lr(0.1, 0.01, 1, 4) == pytest.approx(0.1)
    assert cosine_lr(0.1, 0.01, 3, 4) == pytest.approx(0.055)  # cos(pi/2) = 0: midway
    assert cosine_lr(0.1, 0.01, 5, 4) == pytest.approx(0.01)


# --- the three stages in one start ------------------------------------------------------


def test_tier_unaware_lets_every_client_train_and_run_every_path(run_config):
    grid = InProcessGrid(client_app, run_config, NUM_NODES)
    aware = make_strategy(run_config)
    aware.setup(grid)
    unaware = make_strategy({**run_config, "fedoras.tier-aware": False})
    unaware.setup(grid)
    assert unaware.tiers == aware.tiers  # the same tiers: one model per tier is still searched
    assert len(set(aware.tier_of_partition.values())) > 1
    top = len(unaware.tiers) - 1
    assert set(unaware.tier_of_partition.values()) == {top}
    nodes = sorted(unaware.profiles)
    context = unaware.stage_context()
    for tier in range(len(unaware.tiers)):  # every tier's model: all clients eligible
        assert sorted(p.node_id for p in context.eligible(tier)) == nodes
    assert len(aware.stage_context().eligible(top)) < len(nodes)
    # Stage 1: every client samples within the whole space, not within its tier's bound
    arrays = ArrayRecord(unaware.space.state_dict())
    messages = list(unaware.configure_train(1, arrays, ConfigRecord(), grid))
    bounds = {m.content.config_records["config"]["max-flops"] for m in messages}
    assert bounds == {float(unaware.space.max_flops())}
    aware_messages = list(aware.configure_train(1, arrays, ConfigRecord(), grid))
    assert len({m.content.config_records["config"]["max-flops"] for m in aware_messages}) > 1


def test_step_learning_rate_by_hand():
    # the paper's Shakespeare schedule: 10x down at rounds 50 and 75 of 100 (fine-tuning)
    # and 250 and 375 of 500 (rand-init), as MultiStepLR([50, 75]) over rounds from 0
    lrs = {r: step_lr(1.0, r, 100) for r in (1, 50, 51, 75, 76, 100)}
    assert lrs == pytest.approx({1: 1.0, 50: 1.0, 51: 0.1, 75: 0.1, 76: 0.01, 100: 0.01})
    assert step_lr(0.5, 250, 500) == 0.5 and step_lr(0.5, 251, 500) == pytest.approx(0.05)
    assert step_lr(0.5, 376, 500) == pytest.approx(0.005)


def test_one_start_runs_search_and_finetuning_for_every_tier(three_stages):
    strategy, grid, result = three_stages
    assert [s.tier for s in result.searches] == [0, 1, 2, 3]
    for search, tier in zip(result.searches, result.tiers, strict=True):
        assert tier.contains(strategy.space.cost(search.best).flops)
    assert [(m.tier, m.init) for m in result.models] == [(t, "supernet") for t in range(4)]
    for model in result.models:
        assert model.arch == result.searches[model.tier].best
        assert model.names == strategy.space.option_names(model.arch)
        assert set(model.arrays.keys()) == set(strategy.space.path_keys(model.arch))
        assert 0.0 <= model.test.accuracy <= 1.0 and model.test.clients >= 1
        assert model.test.client_worst <= model.test.client_mean
        assert len(model.history) == 1 and "val-accuracy" in model.history[0]


def test_result_json_gives_macs_beside_every_flops(three_stages):
    """The papers' "FLOPs" are MACs: result.json's tiers, search points and models give
    MACs (FLOPs / 2) beside every FLOPs count."""
    strategy, grid, result = three_stages
    content = result_json(
        {
            "space": describe_space(strategy.space),
            "tiers": tier_entries(result),
            "search": [s.summary() for s in result.searches],
            "models": [m.summary() for m in result.models],
        }
    )
    assert "2 x MACs" in content["space"]["flops_convention"]
    assert content["space"]["max_macs"] * 2 == content["space"]["max_flops"]
    for tier in content["tiers"]:
        assert (tier["low_macs"], tier["high_macs"]) == (tier["low"] / 2, tier["high"] / 2)
    points = [p for search in content["search"] for p in search["points"]]
    assert points and all(p["macs"] * 2 == p["flops"] for p in points)
    for model in content["models"]:
        tier = content["tiers"][model["tier"] - 1]
        assert model["macs"] * 2 == model["flops"]
        assert tier["low_macs"] < model["macs"] <= tier["high_macs"]


def test_finetuning_starts_from_the_supernet_weights_of_the_path(three_stages, run_config):
    strategy, grid, result = three_stages
    first = next(m for m in grid.sent if m.metadata.message_type == FEDORAS_TRAIN)
    arch = tuple(int(v) for v in first.content.config_records["config"]["arch"])
    assert arch == result.searches[0].best
    # the supernet's weights of the path, with the BN statistics the search scored it with
    scored = strategy.server_scorer.scored_state(result.arrays, arch)
    for key, array in unpack_content(first.content).array_records["arrays"].items():
        np.testing.assert_array_equal(array.numpy(), scored[key].numpy())
        if not key.endswith(("running_mean", "running_var", "num_batches_tracked")):
            np.testing.assert_array_equal(array.numpy(), result.arrays[key].numpy())


def test_stage3_never_sends_a_model_to_a_client_below_its_tier(three_stages):
    strategy, grid, result = three_stages
    tier_of_node = {n: strategy.tier_of_node(n) for n in strategy.profiles}
    sent = [
        m
        for m in grid.sent
        if m.metadata.message_type in (FEDORAS_TRAIN, FEDORAS_EVALUATE, FEDORAS_PATHS)
    ]
    assert any(m.metadata.message_type == FEDORAS_TRAIN for m in sent)
    for message in sent:
        config = message.content.config_records["config"]
        if message.metadata.message_type == FEDORAS_PATHS:
            continue  # tiny config scores on the server: none expected
        arch = [int(v) for v in config["arch"]]
        tier = next(s.tier for s in result.searches if list(s.best) == arch)
        assert tier_of_node[message.metadata.dst_node_id] >= tier
    # the lowest tier's model is tested on every node, the top one on the top tier only
    top_members = sum(1 for t in tier_of_node.values() if t == 3)
    assert result.models[3].test.clients == top_members
    assert result.models[0].test.clients == NUM_NODES


def test_same_seed_same_search_and_models(run_config, three_stages):
    first = three_stages[2]  # the same config, run through Stage 3 after the search
    second = run(run_config, stop_after="search")[2]
    assert [s.best for s in first.searches] == [s.best for s in second.searches]
    assert [s.summary() for s in first.searches] == [s.summary() for s in second.searches]


def test_federated_scoring_weights_clients_by_examples_and_reports_kendall_tau(run_config):
    config = {**run_config, "fedoras.search-scoring": "both", "fedoras.rounds": 1}
    strategy, grid, result = run(config, stop_after="search")
    scored = [m for m in grid.sent if m.metadata.message_type == FEDORAS_PATHS]
    assert scored
    for message in scored:
        node = message.metadata.dst_node_id
        config_record = message.content.config_records["config"]
        paths = np.asarray(config_record["paths"]).reshape(-1, len(strategy.space.num_options()))
        subspace = strategy.space.subspace_from_mask(config_record["subspace-mask"])
        assert subspace == covering_subspace(paths.tolist(), paths.shape[1])
        assert set(unpack_content(message.content).array_records["arrays"].keys()) == set(
            strategy.space.subspace_keys(subspace)
        )
        assert node in strategy.profiles
    assert set(result.kendall_tau) == {0, 1, 2, 3}
    for search in result.searches:
        assert len(search.federated_accuracy) == len(search.evaluated)
        assert all(0.0 <= a <= 1.0 for a in search.federated_accuracy)
    taus = [t for t in result.kendall_tau.values() if t is not None]
    assert taus and all(-1.0 <= t <= 1.0 for t in taus)


def test_federated_score_is_correct_over_examples_summed_across_clients(run_config):
    """Two clients answer with hand-made counts: accuracy = (1 + 3) / (2 + 4), not the
    mean of their accuracies (0.625); each count within the node's declared validation
    rows (6 of its 64: FEW_ROWS)."""
    config = {**run_config, "fedoras.search-scoring": "federated", "fedoras.rounds": 1}
    settings = parse_run_config(config)
    strategy = make_strategy(config, server_data=None)
    grid = InProcessGrid(client_app, config, NUM_NODES)
    strategy.setup(grid)
    answers = iter([(2, 1), (4, 3)])

    def fixed(reply):
        n, c = next(answers)
        metrics = MetricRecord({"num-examples": n, "correct": [c], "loss-sum": [1.0]})
        return replace_content(reply, RecordDict({METRICS: metrics}))

    grid.faults = dict.fromkeys(grid.contexts, fixed)
    scorer = FederatedPathScorer(
        strategy.stage_context(), grid, ArrayRecord(strategy.space.state_dict()), 3
    )
    path = tuple(0 for _ in strategy.space.num_options())
    assert settings.method_settings.search_clients == 2
    assert scorer([path]) == [pytest.approx(4 / 6)]


def test_federated_replies_with_wrong_lengths_are_dropped(run_config, caplog):
    config = {
        **run_config,
        "fedoras.search-scoring": "federated",
        "fedoras.rounds": 1,
        "fedoras.min-replies": 1,
    }
    strategy = make_strategy(config, server_data=None)
    grid = InProcessGrid(client_app, config, NUM_NODES)
    strategy.setup(grid)
    supernet = ArrayRecord(strategy.space.state_dict())
    path = tuple(0 for _ in strategy.space.num_options())
    honest = FederatedPathScorer(strategy.stage_context(), grid, supernet, 0)([path])[0]
    chosen = [m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type == FEDORAS_PATHS]
    assert len(chosen) == 2

    def short(reply):
        metrics = MetricRecord({"num-examples": 5, "correct": [1, 2], "loss-sum": [1.0, 1.0]})
        return replace_content(reply, RecordDict({METRICS: metrics}))

    grid.faults = {chosen[0]: short}
    accuracy = FederatedPathScorer(strategy.stage_context(), grid, supernet, 0)([path])[0]
    assert f"dropped reply of node {chosen[0]}: 'correct' must hold one value per path" in (
        caplog.text
    )
    assert 0.0 <= accuracy <= 1.0 and 0.0 <= honest <= 1.0  # the other client's score
    assert strategy.ledger.summary()["search-t1"]["nodes"][str(chosen[0])]["rejected"] == 1


def test_server_scoring_without_a_server_slice_fails_before_training(run_config):
    with pytest.raises(ValueError, match="search-scoring.*server-fraction"):
        make_strategy(run_config, server_data=None)


def test_stop_after_supernet_needs_no_server_slice_and_runs_stage1_only(run_config):
    config = {**run_config, "fedoras.stop-after": "supernet"}
    strategy = make_strategy(config, server_data=None)
    grid = InProcessGrid(client_app, config, NUM_NODES)
    result = strategy.start(grid, ArrayRecord(), num_rounds=config["fedoras.rounds"])
    assert len(result.history) == config["fedoras.rounds"] + 1
    assert result.searches == [] and result.models == []
    with pytest.raises(ValueError, match="search-scoring.*stop-after"):
        strategy.search(grid, result.arrays)


def test_rand_init_trains_the_same_architecture_from_other_weights(run_config):
    config = {
        **run_config,
        "fedoras.compare-rand-init": True,
        "fedoras.rounds": 1,  # the claim is about Stage 3: any supernet will do (1: the fewest)
        "fedoras.num-tiers": 2,
        "fedoras.rand-init-rounds": 2,
        "fedoras.rand-init-lr": 0.2,
        "fedoras.rand-init-clients-per-round": 5,  # fine-tuning: 3 (tiny_fedoras)
    }
    strategy, grid, result = run(config)
    assert [(m.tier, m.init) for m in result.models] == [
        (0, "supernet"),
        (0, "random"),
        (1, "supernet"),
        (1, "random"),
    ]
    # rand-init gets its own round count (the paper trains it 5x longer), its own lr
    # (the paper: 0.1 from scratch against 0.01 from the supernet) and a cosine schedule
    # over its rounds
    rounds = {m.init: [h["round"] for h in m.history] for m in result.models}
    assert rounds == {"supernet": [1], "random": [1, 2]}
    cold_lrs = [h["lr"] for h in result.models[1].history]
    assert cold_lrs[0] == pytest.approx(0.2)
    assert result.models[0].history[0]["lr"] == pytest.approx(strategy.settings.finetune.lr)
    assert cold_lrs[1] < cold_lrs[0]
    trains = [m for m in grid.sent if m.metadata.message_type == FEDORAS_TRAIN]
    # and its own clients per round (the paper: 10 against fine-tuning's 6, Table 11): every
    # round of each tier (6 eligible nodes at the least) samples that many
    per_round = {}
    for m in trains:
        stamp = nonce_of(m)  # its stage (tier and init) and round
        key = (stamp["stage"], stamp["step"])
        per_round[key] = per_round.get(key, 0) + 1
    assert per_round == {
        ("finetune-t1-supernet", 1): 3,
        ("finetune-t1-random", 1): 5,
        ("finetune-t1-random", 2): 5,
        ("finetune-t2-supernet", 1): 3,
        ("finetune-t2-random", 1): 5,
        ("finetune-t2-random", 2): 5,
    }
    by_phase = {m.content.config_records["config"]["phase"]: m for m in trains}
    warm, cold = by_phase["finetune-supernet"], by_phase["finetune-random"]
    assert (
        warm.content.config_records["config"]["arch"]
        == cold.content.config_records["config"]["arch"]
    )
    warm_arrays = unpack_content(warm.content).array_records["arrays"]
    cold_arrays = unpack_content(cold.content).array_records["arrays"]
    key = next(iter(warm_arrays.keys()))
    assert not np.array_equal(warm_arrays[key].numpy(), cold_arrays[key].numpy())


def test_fine_tuning_starts_from_the_model_the_search_scored(three_stages):
    strategy, _, result = three_stages
    scorer, supernet = strategy.server_scorer, result.arrays
    arch = result.searches[-1].best
    scorer.load(supernet)
    scored = scorer([arch])[0]
    start = initial_subnet(strategy.stage_context(), supernet, arch, SUPERNET_INIT, tier=0)
    net = build_space(**strategy.space.spec).subnet(arch)
    net.load_state_dict(start.to_torch_state_dict())
    again = evaluate(net.eval(), scorer.loader, torch.device("cpu"))
    assert again.accuracy == pytest.approx(scored.accuracy)
    assert again.loss == pytest.approx(scored.loss, rel=1e-5)
    # the same weights; the path's BN statistics re-estimated, not the supernet's
    keys = strategy.space.path_keys(arch)
    stats = [k for k in keys if k.endswith(("running_mean", "running_var"))]
    weights = [k for k in keys if k.endswith("weight")]
    assert stats and weights
    assert all(np.array_equal(start[k].numpy(), supernet[k].numpy()) for k in weights)
    assert any(not np.allclose(start[k].numpy(), supernet[k].numpy()) for k in stats)


def test_plain_fedavg_of_supernets_returns_and_averages_every_key_sent(run_config, three_stages):
    config = {**run_config, "fedoras.aggregation": "fedavg"}
    strategy, grid, result = run(config, stop_after="supernet")
    assert all(h.get("clients", 6) == 6 for h in result.history[1:])
    opa_result = three_stages[2]  # OPA (the default) on the same config: its Stage-1 supernet
    differs = [
        k
        for k in result.arrays.keys()
        if not np.array_equal(result.arrays[k].numpy(), opa_result.arrays[k].numpy())
    ]
    assert differs  # the two aggregations give different supernets


def test_resume_from_a_checkpoint_skips_stage1(run_config, tmp_path, three_stages):
    strategy, _, result = three_stages
    path = save_checkpoint(
        tmp_path / "supernet.pt",
        space_spec=strategy.space.spec,
        arrays=result.arrays,
        stage="supernet",
    )
    arrays = resume_supernet(str(path), build_supernet(parse_run_config(run_config)))
    resumed_strategy, grid, resumed = run(
        run_config, initial_arrays=arrays, supernet_trained=True, stop_after="search"
    )
    assert resumed.history == []
    assert not [m for m in grid.sent if m.metadata.message_type == FEDORAS_SUPERNET]
    assert [s.best for s in resumed.searches] == [s.best for s in result.searches]


def test_resume_rejects_a_checkpoint_of_another_space(run_config, tmp_path):
    other = build_space(
        "cnn_s", num_classes=10, in_channels=1, input_height=28, input_width=28, width=0.5
    )
    path = save_checkpoint(
        tmp_path / "other.pt",
        space_spec=other.spec,
        arrays=ArrayRecord(other.state_dict()),
        stage="supernet",
    )
    with pytest.raises(ValueError, match="resume-from.*not a Stage-1 checkpoint"):
        resume_supernet(str(path), build_supernet(parse_run_config(run_config)))
    with pytest.raises(ValueError, match="resume-from.*cannot load"):
        resume_supernet(str(tmp_path / "missing.pt"), build_supernet(parse_run_config(run_config)))


def test_a_corrupt_finetuning_reply_is_dropped_and_the_model_stays_finite(run_config, caplog):
    def poison(reply):
        if reply.metadata.message_type != FEDORAS_TRAIN:
            return reply
        arrays = reply.content.array_records["arrays"]
        key = next(iter(arrays.keys()))
        values = arrays[key].numpy().copy()
        values.flat[0] = math.nan
        bad = ArrayRecord({k: arrays[k] for k in arrays.keys()})
        bad[key] = Array(values)
        metrics = reply.content.metric_records[METRICS]
        return replace_content(reply, RecordDict({ARRAYS: bad, METRICS: metrics}))

    config = {
        **run_config,
        "fedoras.rounds": 1,  # the claim is about Stage 3: any supernet will do (1: the fewest)
        "fedoras.num-tiers": 1,
        "fedoras.finetune-clients-per-round": 12,
    }
    faults = {0: poison}
    caplog.set_level(logging.INFO, logger="flwr")
    strategy, grid, result = run(config, faults=faults)
    assert "dropped reply of node" in caplog.text
    for array in result.models[0].arrays.values():
        assert torch.isfinite(torch.as_tensor(array.numpy())).all()
    # the log lines that give FLOPs give MACs (FLOPs / 2, the paper's "FLOPs") beside them
    (tier,), model = result.tiers, result.models[0]
    low, high = tier.low, tier.high
    assert f"Tier 1: FLOPs ({low:.4g}, {high:.4g}] = MACs ({low / 2:.4g}, {high / 2:.4g}]" in (
        caplog.text
    )
    cost = f"{model.flops / 1e6:.4g} MFLOPs ({model.flops / 2e6:.4g} MMACs)"
    names = re.escape("-".join(model.names))
    search = rf"\[SEARCH\] tier 1: best {names}, accuracy [0-9.]+, {re.escape(cost)}$"
    assert re.search(search, caplog.text, re.MULTILINE)
    assert f"[finetune-t1-supernet] {'-'.join(model.names)} {cost}: " in caplog.text


def test_the_text_task_runs_all_three_stages_and_reports_perplexity(data_cache):
    config = tiny_fedoras(
        data_cache,
        **{
            "data.dataset": "pydoc-topics",
            "data.seq-len": 16,
            "space.name": "rnn",
            "space.width": 0.125,
            "fedoras.num-tiers": 2,
            "fedoras.batch-size": 128,
            "fedoras.finetune-batch-size": 128,
            "fedoras.search-scoring": "both",
            "fedoras.finetune-rounds": 4,
            "fedoras.finetune-lr-schedule": "step",  # the paper's Shakespeare recipe
        },
    )
    strategy, grid, result = run(config)
    assert strategy.space.spec["name"] == "rnn"
    assert len(result.models) == 2
    # the rnn space clips at norm 5 by default (paper, Tables 9-11), in Stage 1 and Stage 3
    trains = [m for m in grid.sent if m.metadata.message_type in (FEDORAS_SUPERNET, FEDORAS_TRAIN)]
    assert {m.metadata.message_type for m in trains} == {FEDORAS_SUPERNET, FEDORAS_TRAIN}
    assert {m.content.config_records["config"]["grad-clip"] for m in trains} == {5.0}
    lr = strategy.settings.finetune.lr  # 10x down at rounds 2 and 3 of 4 (50% and 75%)
    for model in result.models:
        assert [h["lr"] for h in model.history] == pytest.approx([lr, lr, lr / 10, lr / 100])
    for model in result.models:
        test = model.test
        assert test.perplexity == pytest.approx(math.exp(test.loss))
        vocabulary = strategy.space.spec["vocab_size"]
        assert 1.0 < test.perplexity < 2 * vocabulary  # trained a little: near or below uniform
    assert set(result.kendall_tau) == {0, 1}


def test_random_search_spends_fedoras_client_compute_on_random_paths_in_the_tier(run_config):
    config = {
        **run_config,
        "fedoras.num-tiers": 2,
        "fedoras.rounds": 3,
        "fedoras.compare-random-search": True,
        "fedoras.random-search-paths": 2,
    }
    strategy, grid, result = run(config)
    baselines = [m for m in result.models if m.init == "random-search"]
    assert [m.tier for m in baselines] == [0, 1]
    ledger = result.ledger
    fedoras = ledger["supernet"]["totals"]["train_flops"] + sum(
        ledger[f"finetune-t{t}-supernet"]["totals"]["train_flops"] for t in (1, 2)
    )
    for model in baselines:
        assert result.tiers[model.tier].contains(model.flops)
        assert model.test is not None and model.search_accuracy == model.history[-1]["val-accuracy"]
        spent = sum(
            ledger[f"finetune-t{model.tier + 1}-random-search-{c}"]["totals"]["train_flops"]
            for c in (0, 1)
        )
        prefix = f"finetune-t{model.tier + 1}-random-search-"
        assert sum(1 for stage in ledger if stage.startswith(prefix)) == 2  # two candidates
        # floor(rounds) and the sampled clients' data sizes: within one round's cost of a half
        assert 0.5 * fedoras / 2 < spent < 1.5 * fedoras / 2
