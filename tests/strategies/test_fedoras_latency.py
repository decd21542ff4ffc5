"""FedorAS with latency as the resource (``fedoras.resource = "latency"``) on the in-process
grid: tiers in milliseconds from the nodes' own tables, budgets, each client's paths within
its budget on its own table, NSGA-II within the tier's table, dropped tables, run config.

The nodes' tables are known: ``measure_and_validate`` is replaced by one whose numbers
depend on the node's torch threads (node config ``num-threads``), except in the one real
run at the end."""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import replace

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

import fedorasflwr.latency as latency
from fedorasflwr.client_app import app as client_app
from fedorasflwr.config import parse_run_config
from fedorasflwr.inprocess import InProcessGrid, replace_content
from fedorasflwr.latency import LatencyTable, group_table
from fedorasflwr.methods.fedoras.messages import FEDORAS_SUPERNET
from fedorasflwr.methods.fedoras.runner import build_fedoras, latency_entries
from fedorasflwr.methods.fedoras.tiers import PathCost
from fedorasflwr.protocol import METRICS, QUERY_LATENCY
from fedorasflwr.runs import build_supernet
from tests.runconfig import tiny_fedoras

#: a node's table: every entry is ``SCALE / threads`` times (option index + 1), the fixed
#: part ``SCALE / threads``: one thread is the slowest device
SCALE = 4.0
EPS = 1e-9


@pytest.fixture(scope="module")
def run_config(data_cache):
    return tiny_fedoras(
        data_cache,
        **{
            "fedoras.resource": "latency",
            "fedoras.min-replies": 1,
            "latency.repeats": 1,
            "latency.warmup": 0,
            "latency.validation-paths": 0,
        },
    )


@pytest.fixture(autouse=True)
def node_cache(tmp_path, monkeypatch):
    """Every test its own node cache; torch's threads as they were afterwards."""
    monkeypatch.setenv("FEDORASFLWR_CACHE", str(tmp_path / "cache"))
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def known_table(space, scale):
    return LatencyTable(
        spec=space.spec,
        device="cpu",
        threads=int(SCALE / scale),
        option_ms=tuple(tuple(scale * (o + 1) for o in range(n)) for n in space.num_options()),
        fixed_ms=scale,
    )


@pytest.fixture
def known_tables(monkeypatch):
    """Nodes measure ``known_table(space, SCALE / threads)``."""

    def measure(space, request, **kwargs):
        return known_table(space, SCALE / torch.get_num_threads())

    monkeypatch.setattr(latency, "measure_and_validate", measure)


def make_strategy(config):
    return build_fedoras(parse_run_config(config))


def grid_of(config, node_configs, faults=None):
    return InProcessGrid(
        client_app, config, len(node_configs), node_configs=node_configs, faults=faults
    )


#: the data split in this many partitions whatever the number of nodes (small local data)
PARTITIONS = 12


def threads(*counts):
    """Node configs: partition ``p`` (of :data:`PARTITIONS`) runs ``counts[p]`` torch threads."""
    return {p: {"num-threads": n, "num-partitions": PARTITIONS} for p, n in enumerate(counts)}


def set_up(config, node_configs, faults=None):
    grid = grid_of(config, node_configs, faults)
    strategy = make_strategy(config)
    strategy.setup(grid)
    return strategy, grid


# --- run config -----------------------------------------------------------------------------


def test_a_bad_resource_fails_naming_key_value_and_allowed_values(run_config):
    assert parse_run_config(run_config).method_settings.resource == "latency"
    assert parse_run_config({}).method_settings.resource == "flops"
    with pytest.raises(ValueError, match=r"'fedoras.resource' = 'time': allowed: one of flops, "):
        parse_run_config({**run_config, "fedoras.resource": "time"})


# --- tiers ----------------------------------------------------------------------------------


def test_tiers_are_milliseconds_of_the_group_table_and_the_slowest_node_is_lowest(
    run_config, known_tables
):
    # four nodes, no budget: scales 4, 1, 2, 4 ms -> the group table's entries are the
    # median, (2 + 4) / 2 = 3 times (option + 1)
    strategy, grid = set_up(run_config, threads(1, 4, 2, 1))
    space = strategy.space
    layers, extra = len(space.num_options()), sum(n - 1 for n in space.num_options())
    assert strategy.all_table.option_ms[0][0] == pytest.approx(3.0)
    tiers = strategy.tiers
    assert tiers[0].low == pytest.approx(3.0 * (1 + layers))  # the fastest path
    assert tiers[-1].high == pytest.approx(3.0 * (1 + layers + extra))  # the slowest
    assert all(a.high == b.low for a, b in zip(tiers, tiers[1:], strict=False))
    assert tiers[-1].low < tiers[-1].high
    tier = strategy.tier_of_partition
    assert tier[1] == 3  # four threads: the fastest device, the top tier
    assert tier[2] == 2
    assert sorted([tier[0], tier[3]]) == [0, 1]  # the two slowest share the lowest two
    # each tier's table is its node's own
    for pid, node_id in grid.node_of_partition.items():
        assert strategy.tier_tables[tier[pid]] == strategy.node_tables[node_id]


def test_equal_tables_assign_nodes_as_the_flops_tiers_do(run_config, known_tables):
    strategy, _ = set_up(run_config, threads(2, 2, 2, 2, 2, 2))
    flops, _ = set_up({**run_config, "fedoras.resource": "flops"}, threads(2, 2, 2, 2, 2, 2))
    assert strategy.tier_of_partition == flops.tier_of_partition
    assert strategy.all_table.option_ms == next(iter(strategy.node_tables.values())).option_ms


def test_a_declared_budget_puts_a_node_in_the_largest_tier_within_it(
    run_config, known_tables, caplog
):
    nodes = threads(2, 2, 2, 2)
    plain, _ = set_up(run_config, nodes)
    tiers = plain.tiers
    budgets = {
        0: tiers[1].high,  # exactly tier 2's upper bound: tier 2
        1: tiers[2].high - 1e-6,  # just below tier 3's: tier 2
        2: tiers[0].low / 2,  # below every tier and its own fastest path: tier 1, warned
        3: 10 * tiers[-1].high,  # above all: the top tier
    }
    for pid, budget in budgets.items():
        nodes[pid]["latency-budget-ms"] = budget
    with caplog.at_level(logging.WARNING):
        strategy, grid = set_up(run_config, nodes)
    assert strategy.tiers == tiers  # the bounds do not depend on the budgets
    assert strategy.tier_of_partition == {0: 1, 1: 1, 2: 0, 3: 3}
    low = grid.node_of_partition[2]
    assert f"node {low}: latency-budget-ms = {budgets[2]:g} is below every tier" in caplog.text
    # a node's Stage-1 budget is its declared one (raised to its own fastest path)
    own = {n: PathCost(strategy.space, t) for n, t in strategy.node_tables.items()}
    for pid, node_id in grid.node_of_partition.items():
        expected = max(budgets[pid], own[node_id].lowest())
        assert strategy.budget_ms[node_id] == pytest.approx(expected)
    assert f"node {low}: its budget" in caplog.text


# --- Stage 1: each client within its budget on its own table ---------------------------------


def test_each_client_samples_paths_within_its_budget_on_its_own_table(
    run_config, known_tables, monkeypatch
):
    sampled = []
    sample = PathCost.sample_path

    def recording(self, rng, budget, subspace=None):
        path = sample(self, rng, budget, subspace)
        sampled.append((self.table, budget, path))
        return path

    monkeypatch.setattr(PathCost, "sample_path", recording)
    config = {**run_config, "fedoras.rounds": 1, "fedoras.clients-per-round": 4}
    grid = grid_of(config, threads(1, 2, 4, 1))
    strategy = make_strategy(config)
    strategy.settings = replace(strategy.settings, stop_after="supernet")
    strategy.start(grid, ArrayRecord(), 1)
    messages = [m for m in grid.sent if m.metadata.message_type == FEDORAS_SUPERNET]
    assert len(messages) == 4
    sent = set()
    for message in messages:
        node_id = message.metadata.dst_node_id
        config_record = message.content.config_records["config"]
        own = strategy.node_tables[node_id]
        assert config_record["resource"] == "latency"
        assert config_record["latency-option-ms"] == [v for layer in own.option_ms for v in layer]
        assert config_record["latency-fixed-ms"] == own.fixed_ms
        assert config_record["max-latency-ms"] == strategy.budget_ms[node_id]
        tier = strategy.tiers[strategy.tier_of_node(node_id)]
        assert strategy.budget_ms[node_id] == max(tier.high, PathCost(strategy.space, own).lowest())
        sent.add((own.option_ms, own.fixed_ms, strategy.budget_ms[node_id]))
    assert sampled, "no client sampled a path"
    budgets = set()
    for table, budget, path in sampled:
        assert (table.option_ms, table.fixed_ms, budget) in sent  # a node's own table and budget
        assert table.path_ms(path) <= budget * (1 + EPS)
        budgets.add(budget)
    assert len(budgets) > 1  # the slow and the fast nodes sampled within different budgets


def test_a_dropped_latency_reply_leaves_the_node_out_without_failing(
    run_config, known_tables, caplog
):
    def negative(reply: Message) -> Message:
        if reply.metadata.message_type != QUERY_LATENCY:
            return reply
        metrics = dict(reply.content.metric_records[METRICS])
        values = list(metrics[latency.OPTION_MS])
        values[0] = -1.0
        records = dict(reply.content.items())
        records[METRICS] = MetricRecord({**metrics, latency.OPTION_MS: values})
        return replace_content(reply, RecordDict(records))

    config = {**run_config, "fedoras.rounds": 1, "fedoras.clients-per-round": 3}
    grid = grid_of(config, threads(1, 2, 4), faults={1: negative})
    strategy = make_strategy(config)
    strategy.settings = replace(strategy.settings, stop_after="supernet")
    with caplog.at_level(logging.WARNING):
        result = strategy.start(grid, ArrayRecord(), 1)
    bad = grid.node_of_partition[1]
    assert f"[latency] dropped reply of node {bad}" in caplog.text
    assert f"node {bad}: no latency table; left out of this run" in caplog.text
    assert bad not in strategy.profiles and 1 not in result.tier_of_partition
    trained = {
        m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type == FEDORAS_SUPERNET
    }
    assert bad not in trained and len(trained) == 2


# --- Stage 2: NSGA-II within the tier's latency bound on the tier's table ---------------------


def test_the_search_keeps_each_tier_within_its_bound_on_the_tiers_table(run_config, known_tables):
    strategy, grid = set_up(run_config, threads(1, 1, 2, 2, 4, 4))
    for tier in strategy.tiers:
        members = [
            strategy.node_tables[n]
            for n in sorted(strategy.profiles)
            if strategy.tier_of_node(n) == tier.index
        ]
        assert strategy.tier_tables[tier.index] == group_table(members)
    arrays = ArrayRecord(strategy.space.state_dict())
    searches, _ = strategy.search(grid, arrays)
    assert [s.tier for s in searches] == [0, 1, 2, 3]
    placed_on = strategy.all_table  # the table the tiers were cut on
    for search in searches:
        tier, table = strategy.tiers[search.tier], strategy.tier_tables[search.tier]
        for point in search.evaluated:
            on_devices, placed = table.path_ms(point.path), placed_on.path_ms(point.path)
            above = placed >= tier.low if tier.index == 0 else placed > tier.low
            assert point.latency_ms == pytest.approx(on_devices)
            assert point.feasible == (above and on_devices <= tier.high)
        if search.tier > 0:  # tier 1's two slowest devices may run no path of it in time
            assert any(p.feasible for p in search.evaluated)
        if any(p.feasible for p in search.evaluated):
            assert table.path_ms(search.best) <= tier.high  # runs in time on the tier's devices
        summary = search.summary()
        assert all("latency-ms" in p and "flops" in p for p in summary["points"])


# --- all three stages, measured for real -------------------------------------------------------


def test_a_real_run_measures_tables_and_runs_all_three_stages(run_config):
    config = {**run_config, "fedoras.rounds": 1}  # the tables and stages, not the training
    grid = grid_of(config, {p: {"num-partitions": PARTITIONS} for p in range(6)})
    strategy = make_strategy(config)
    result = strategy.start(grid, ArrayRecord(), strategy.settings.train.rounds)
    assert result.resource == "latency"
    assert sorted(result.latency_tables) == sorted(strategy.profiles)
    # the simulation engine's case: one device, so every node measures its own (equal
    # hardware) table and no budget is declared
    assert len(result.tiers) == 4 and all(t.high > t.low >= 0 for t in result.tiers)
    assert {m.tier for m in result.models} == {s.tier for s in result.searches}
    for model in result.models:
        table = result.tier_tables[model.tier]
        assert model.latency_ms == pytest.approx(table.path_ms(model.arch))
        summary = model.summary()
        assert summary["latency-ms"] > 0 and summary["flops"] > 0
    doc = json.loads(json.dumps(latency_entries(strategy, result)))
    assert doc["resource"] == "latency"
    assert len(doc["latency-tables"]["nodes"]) == 6
    assert sorted(doc["tier-latency-tables"]) == ["1", "2", "3", "4"]
    assert all(math.isfinite(n["min-path-ms"]) for n in doc["latency-tables"]["nodes"])
    assert np.all([t.fixed_ms >= 0 for t in result.latency_tables.values()])


# --- resume: the nodes' cached tables give the same tiers -------------------------------------


def test_a_resumed_latency_stage1_equals_the_uninterrupted_one(run_config, tmp_path):
    """Stopped before round 2 and resumed: the nodes answer the repeated latency query
    from their caches, so the tiers, the assignment and the supernet are the whole run's."""
    from tests.test_checkpoints import StoppingGrid, assert_same_weights, result_of, run_main

    base = {**run_config, "fedoras.stop-after": "supernet", "checkpoint-every": 1}
    nodes = {p: {"num-partitions": PARTITIONS} for p in range(4)}

    def config(name, **extra):
        return {**base, "output-dir": str(tmp_path / name), **extra}

    whole = run_main(grid_of(config("whole"), nodes), config("whole"))
    stopped_config = config("stopped")
    grid = StoppingGrid(
        client_app,
        stopped_config,
        len(nodes),
        node_configs=nodes,
        message_type=FEDORAS_SUPERNET,
        stop=2,
    )
    with pytest.raises(ConnectionError):
        run_main(grid, stopped_config)
    (stopped,) = (tmp_path / "stopped").iterdir()
    resumed_config = config("resumed", **{"resume-from": str(stopped / "checkpoint.pt")})
    resumed = run_main(grid_of(resumed_config, nodes), resumed_config)
    first, second = result_of(whole), result_of(resumed)
    assert second["resumed_from"].endswith("checkpoint.pt")
    assert first["tiers"] == second["tiers"]
    assert first["tier_of_partition"] == second["tier_of_partition"]
    assert first["latency_tables"] == second["latency_tables"]
    assert_same_weights(whole / "supernet.pt", resumed / "supernet.pt")


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"latency-option-ms": "short"}, "'latency-option-ms' has 3 entries"),
        ({"latency-option-ms": "nan"}, "not a finite number > 0"),
        ({"latency-option-ms": "zero"}, "not a finite number > 0"),
        ({"latency-fixed-ms": -1.0}, "'latency-fixed-ms' = -1.0"),
        ({"max-latency-ms": math.inf}, "'max-latency-ms' = inf"),
    ],
)
def test_the_client_refuses_a_table_or_budget_it_cannot_use(run_config, change, reason):
    from fedorasflwr.methods.fedoras.client import supernet_budget

    space = build_supernet(parse_run_config(run_config))
    count = sum(space.num_options())
    options = {
        "short": [1.0, 1.0, 1.0],
        "nan": [math.nan] + [1.0] * (count - 1),
        "zero": [0.0] + [1.0] * (count - 1),
    }
    config = {
        "resource": "latency",
        "latency-option-ms": [1.0] * count,
        "latency-fixed-ms": 0.5,
        "max-latency-ms": 10.0,
    }
    cost, budget = supernet_budget(space, config)  # the well-formed one is taken
    assert budget == 10.0 and cost.table is not None
    key, value = next(iter(change.items()))
    config[key] = options.get(value, value) if isinstance(value, str) else value
    with pytest.raises(ValueError, match=re.escape(reason)):
        supernet_budget(space, config)


def test_a_tier_whose_devices_run_no_path_in_time_searches_their_fastest_paths(
    run_config, known_tables, caplog
):
    # two 1-thread nodes among 4-thread ones: the tiers are cut on the median table (the
    # 4-thread one), and the lowest tier's bound lies below the 1-thread nodes' fastest
    # path (4x every entry): no path of the tier runs in time on its devices
    strategy, grid = set_up(run_config, threads(1, 1, 4, 4, 4, 4, 4, 4))
    slow = {n for n in strategy.profiles if strategy.node_tables[n].threads == 1}
    assert {n for n in strategy.profiles if strategy.tier_of_node(n) == 0} == slow
    cost = strategy.tier_cost(0)
    assert cost.lowest() > strategy.tiers[0].high
    with caplog.at_level(logging.WARNING, logger="flwr"):
        searches, _ = strategy.search(grid, ArrayRecord(strategy.space.state_dict()))
    lowest = next(s for s in searches if s.tier == 0)
    assert lowest.evaluated and not any(p.feasible for p in lowest.evaluated)
    # the least violating path it scored: nearest the bound on the tier's devices
    assert cost.of(lowest.best) == min(cost.of(p.path) for p in lowest.evaluated)
    assert "Tier 1: no path scored lies in the tier" in caplog.text
