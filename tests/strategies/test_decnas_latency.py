"""DecNAS with latency as the resource (NetAdapt's): the layer-wise table's math against
hand-computed values, the budget schedule in ms, only the target devices measure, bad
tables dropped naming the node, the new run-config keys, and one real run end to end.

Timings are injected where a number is asserted; wall-clock numbers are only checked for
consistency (the run end to end)."""

from __future__ import annotations

import logging
import math
import threading
import time

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from torch import Tensor, nn

import fedorasflwr.clients.layer_latency as node_side
import fedorasflwr.methods.decnas.latency as layer_latency
from fedorasflwr.client_app import app as client_app
from fedorasflwr.config import parse_run_config
from fedorasflwr.federation.base import StageFailedError
from fedorasflwr.inprocess import InProcessGrid, replace_content
from fedorasflwr.latency import LatencyRequest, LatencyTable, group_table
from fedorasflwr.methods.decnas.latency import (
    LayerLayout,
    layer_layout,
    measure_layer_table,
    predict_ms,
    width_grid,
)
from fedorasflwr.methods.decnas.messages import QUERY_DECNAS_LATENCY
from fedorasflwr.methods.decnas.netadapt import budget
from fedorasflwr.methods.decnas.runner import build_decnas_net
from fedorasflwr.methods.decnas.strategy import DecNAS
from fedorasflwr.protocol import LATENCY, METRICS
from fedorasflwr.search_spaces.prunable import build_prunable, prune_to_budget
from tests.runconfig import tiny_decnas


class TwoConv(nn.Module):
    """conv 3x3 (4 filters) -> conv 3x3 (2 filters) -> linear: two prunable layers."""

    def __init__(self, num_classes: int = 2, in_channels: int = 1, size: int = 4) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(in_channels, 4, 3, padding=1)
        self.c2 = nn.Conv2d(4, 2, 3, padding=1)
        self.fc = nn.Linear(2 * size * size, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(torch.flatten(torch.relu(self.c2(torch.relu(self.c1(x)))), 1))


def two_conv() -> LayerLayout:
    net = build_prunable(TwoConv, input_shape=(1, 4, 4), num_classes=2, in_channels=1, size=4)
    return layer_layout(net.spec, points=2)


def hand_table(layout: LayerLayout, fixed: float = 0.5) -> LatencyTable:
    """c1: w0 ms, c2: w0 x w1 ms, fc: 10 w1 ms (the entries in table order)."""
    c1, c2, fc = layout.units
    option_ms = (
        tuple(float(w0) for (w0,) in layout.combos(c1)),
        tuple(float(w0 * w1) for w0, w1 in layout.combos(c2)),
        tuple(10.0 * w1 for (w1,) in layout.combos(fc)),
    )
    return LatencyTable(layout.spec, "cpu", 1, option_ms, fixed)


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """Every test its own node cache (``$FEDORASFLWR_CACHE``)."""
    monkeypatch.setenv("FEDORASFLWR_CACHE", str(tmp_path / "cache"))


# --- the table's math --------------------------------------------------------------------


def test_the_grid_holds_one_and_the_width_in_steps():
    assert width_grid(4, 2) == (1, 2, 4)
    assert width_grid(2, 2) == (1, 2)
    assert width_grid(16, 8) == (1, 2, 4, 6, 8, 10, 12, 14, 16)


def test_units_follow_the_widths_that_shape_them():
    layout = two_conv()
    assert [(u.name, u.deps) for u in layout.units] == [
        ("c1", (0,)),
        ("c2", (0, 1)),
        ("fc", (1,)),
    ]
    assert layout.grids == ((1, 2, 4), (1, 2))
    assert layout.num_options() == (3, 6, 2)
    assert layout.combos(layout.units[1]) == [(1, 1), (1, 2), (2, 1), (2, 2), (4, 1), (4, 2)]


def test_prediction_is_the_fixed_part_plus_interpolated_entries():
    layout = two_conv()
    table = hand_table(layout)
    assert predict_ms(table, layout, (4, 2)) == pytest.approx(0.5 + 4 + 8 + 20)
    assert predict_ms(table, layout, (1, 1)) == pytest.approx(0.5 + 1 + 1 + 10)
    # w0 = 3 lies half way between the grid points 2 and 4: c1 3, c2 (4 + 8) / 2
    assert predict_ms(table, layout, (3, 2)) == pytest.approx(0.5 + 3 + 6 + 20)
    assert predict_ms(table, layout, (3, 1)) == pytest.approx(0.5 + 3 + 3 + 10)
    with pytest.raises(ValueError, match="outside the table's grid"):
        predict_ms(table, layout, (5, 2))


def test_the_group_table_is_the_per_entry_median():
    layout = two_conv()
    tables = [hand_table(layout, fixed) for fixed in (0.5, 0.7, 9.0)]
    slow = tables[2]
    tables[2] = LatencyTable(
        slow.spec, "cpu", 1, tuple(tuple(10 * v for v in u) for u in slow.option_ms), 9.0
    )
    group = group_table(tables)
    assert group.fixed_ms == 0.7
    assert predict_ms(group, layout, (4, 2)) == pytest.approx(0.7 + 4 + 8 + 20)


def test_measuring_times_every_entry_in_table_order(monkeypatch):
    layout = two_conv()
    calls = []

    def fake(runs, repeats, warmup, sync, statistic, clock):
        calls.append(len(runs))
        if len(calls) == 1:  # the units' entries
            for run in runs:
                run()  # each entry runs its unit on its input
            return [float(i + 1) for i in range(len(runs))]
        return [100.0] * len(runs)  # the nets end to end

    monkeypatch.setattr(layer_latency, "_timed_ms", fake)
    request = LatencyRequest(repeats=1, warmup=0, validation_paths=3, seed=0)
    table = measure_layer_table(layout, request, device="cpu")
    assert table.option_ms == ((1.0, 2.0, 3.0), (4.0, 5.0, 6.0, 7.0, 8.0, 9.0), (10.0, 11.0))
    assert calls == [11, layer_latency.FIXED_NETS, 3]
    nets = layer_latency._grid_nets(layout, layer_latency.FIXED_NETS, 0)
    zero = LatencyTable(table.spec, "cpu", 1, table.option_ms, 0.0)
    expected = sorted(100.0 - predict_ms(zero, layout, w) for w in nets)[len(nets) // 2]
    assert table.fixed_ms == pytest.approx(expected)
    assert table.validation is not None and table.validation.paths == 3


def test_nodes_of_one_host_asking_at_once_measure_one_layer_table(monkeypatch):
    # as query.latency's tables: the first asker takes the cache file's lock and measures,
    # the others wait and read it (seen on the simulation engine without the lock: 6 nodes
    # of one host, two different tables)
    layout, measured = two_conv(), []

    def slow(layout, request, device):
        measured.append(1)
        time.sleep(0.5)  # long enough for every asker to arrive while it measures
        return hand_table(layout)

    monkeypatch.setattr(node_side, "measure_layer_table", slow)
    request = LatencyRequest(repeats=1, warmup=0, validation_paths=0, seed=0)
    start, answers = threading.Barrier(3), []

    def ask() -> None:
        start.wait()
        answers.append(node_side.cached_layer_table(layout, request, device="cpu"))

    askers = [threading.Thread(target=ask) for _ in range(3)]
    for asker in askers:
        asker.start()
    for asker in askers:
        asker.join(timeout=60)
    assert measured == [1]
    assert sorted(fresh for _, fresh in answers) == [False, False, True]
    assert len({table.option_ms for table, _ in answers}) == 1


def test_pruning_by_a_table_keeps_the_most_filters_that_fit():
    net = build_prunable(TwoConv, input_shape=(1, 4, 4), num_classes=2, in_channels=1, size=4)
    layout = layer_layout(net.spec, points=2)
    table = hand_table(layout)

    def cost(widths):
        return predict_ms(table, layout, widths)

    # layer 0 at w0 costs 0.5 + w0 + 2 w0 + 20 = 20.5 + 3 w0: 27 ms fit w0 = 2
    pruned = prune_to_budget(net, 0, 27.0, cost=cost)
    assert pruned is not None and pruned.widths == (2, 2)
    assert prune_to_budget(net, 0, 20.0, cost=cost) is None


def test_the_budget_schedule_in_ms():
    gm0 = 10.0  # ms on the target devices' table
    first = budget(gm0, gm0, 1, 0.1, 0.5, 0.5 * gm0)
    second = budget(first, gm0, 2, 0.1, 0.5, 0.5 * gm0)
    assert (first, second) == pytest.approx((9.0, 8.5))
    assert budget(5.2, gm0, 3, 0.1, 0.5, 0.5 * gm0) == 5.0  # never below the target


# --- the run config ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"decnas.resource": "flops"}, "macs, params, latency"),
        ({"decnas.resource": "latency", "decnas.latency-devices": "a phone"}, "device-class"),
        ({"decnas.latency-devices": "phone"}, "'decnas.resource' = \"latency\" only"),
        ({"decnas.resource": "latency", "decnas.latency-grid": 0}, "1..64"),
    ],
)
def test_bad_latency_keys_name_the_key_value_and_what_is_allowed(data_cache, overrides, fragment):
    key = next(k for k in overrides if k != "decnas.resource" or len(overrides) == 1)
    with pytest.raises(ValueError, match=key.replace(".", r"\.")) as error:
        parse_run_config(tiny_decnas(data_cache, **overrides))
    assert fragment in str(error.value)
    assert repr(overrides[key]) in str(error.value)


def test_latency_keys_parse(data_cache):
    settings = parse_run_config(
        tiny_decnas(data_cache, **{"decnas.resource": "latency", "decnas.latency-devices": "phone"})
    ).method_settings
    assert (settings.resource, settings.latency_devices, settings.latency_grid) == (
        "latency",
        "phone",
        8,
    )


# --- the target nodes --------------------------------------------------------------------


def latency_config(data_cache, **overrides):
    config = {
        "decnas.resource": "latency",
        "decnas.latency-grid": 2,
        "latency.repeats": 1,
        "latency.warmup": 0,
        "latency.validation-paths": 0,
        **overrides,
    }
    return tiny_decnas(data_cache, **config)


def make_strategy(config):
    settings = parse_run_config(config)
    return DecNAS(
        net=build_decnas_net(settings),
        settings=settings.method_settings,
        seed=settings.seed,
        latency=settings.latency.request(settings.seed),
    )


@pytest.fixture
def injected(monkeypatch):
    """Nodes 'measure' a table whose entries are the product of their widths / 100 ms
    (fixed part 0.1 ms); counts the measurements."""
    measured = []

    def fake(layout, request, *, device=None):
        measured.append(layout.spec)
        option_ms = tuple(
            tuple(0.01 * math.prod(combo) for combo in layout.combos(unit)) for unit in layout.units
        )
        return LatencyTable(layout.spec, "cpu", 1, option_ms, 0.1)

    monkeypatch.setattr(node_side, "measure_layer_table", fake)
    return measured


PHONES = {0: {"device-class": "phone"}, 2: {"device-class": "phone"}, 3: {"device-class": "pc"}}


def test_only_the_target_nodes_measure(data_cache, injected):
    config = latency_config(data_cache, **{"decnas.latency-devices": "phone"})
    grid = InProcessGrid(client_app, config, 4, node_configs=PHONES)
    strategy = make_strategy(config)
    strategy.profile_nodes(grid, ConfigRecord({"method": "decnas"}))
    table = strategy.measure_targets(grid)
    asked = sorted(
        m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type == QUERY_DECNAS_LATENCY
    )
    phones = sorted(grid.node_of_partition[p] for p in (0, 2))
    assert asked == phones == sorted(strategy.target_tables)
    assert len(injected) == 1  # the second phone on this host reads the first's cached table
    widths = strategy.net.widths
    assert strategy.latency_cost(widths) == pytest.approx(
        predict_ms(table, strategy.layer_layout, widths)
    )
    summary = strategy.latency_summary()
    assert summary["device-class"] == "phone" and summary["target-nodes"] == [0, 2]


def test_no_node_of_the_class_fails_naming_it(data_cache, injected):
    config = latency_config(data_cache, **{"decnas.latency-devices": "watch"})
    grid = InProcessGrid(client_app, config, 3, node_configs=PHONES)
    strategy = make_strategy(config)
    strategy.profile_nodes(grid, ConfigRecord({"method": "decnas"}))
    with pytest.raises(StageFailedError, match="device class 'watch'"):
        strategy.measure_targets(grid)
    assert not injected


def non_finite(reply):
    if reply.metadata.message_type != QUERY_DECNAS_LATENCY:
        return reply
    metrics = reply.content.metric_records[METRICS]
    values = list(metrics["option-ms"])
    values[0] = math.nan
    records = {METRICS: MetricRecord({**dict(metrics), "option-ms": values})}
    records[LATENCY] = reply.content.config_records[LATENCY]
    return replace_content(reply, RecordDict(records))


def short(reply):
    if reply.metadata.message_type != QUERY_DECNAS_LATENCY:
        return reply
    metrics = reply.content.metric_records[METRICS]
    records = {METRICS: MetricRecord({**dict(metrics), "option-ms": [1.0]})}
    records[LATENCY] = reply.content.config_records[LATENCY]
    return replace_content(reply, RecordDict(records))


def test_bad_tables_are_dropped_naming_the_node(data_cache, injected, caplog):
    config = latency_config(data_cache)
    grid = InProcessGrid(client_app, config, 3, faults={1: non_finite, 2: short})
    strategy = make_strategy(config)
    strategy.profile_nodes(grid, ConfigRecord({"method": "decnas"}))
    with caplog.at_level(logging.WARNING):
        strategy.measure_targets(grid)
    good, nan_node, short_node = (grid.node_of_partition[p] for p in range(3))
    assert sorted(strategy.target_tables) == [good]
    for node in (nan_node, short_node):
        assert strategy.ledger.node("latency", node).rejected == 1
        assert f"dropped reply of node {node}" in caplog.text
    assert "is not finite" in caplog.text and "has 1 entries" in caplog.text


def test_every_bad_table_fails_the_run_naming_the_class(data_cache, injected):
    config = latency_config(data_cache, **{"decnas.latency-devices": "phone"})
    faults = {0: short, 2: non_finite}
    grid = InProcessGrid(client_app, config, 3, node_configs=PHONES, faults=faults)
    strategy = make_strategy(config)
    strategy.profile_nodes(grid, ConfigRecord({"method": "decnas"}))
    with pytest.raises(StageFailedError, match="device class 'phone'"):
        strategy.measure_targets(grid)


# --- end to end ----------------------------------------------------------------------------


def test_a_real_run_by_latency_meets_its_budgets(data_cache):
    config = latency_config(
        data_cache,
        **{
            "decnas.latency-devices": "phone",
            "space.width": 0.5,  # at an eighth, Python's dispatch outweighs any one layer
            "decnas.gm0-rounds": 0,
            "decnas.final-rounds": 0,
            "decnas.max-iterations": 2,
            "decnas.initial-reduction": 0.05,
            "latency.statistic": "min",
            "latency.repeats": 3,
        },
    )
    grid = InProcessGrid(client_app, config, 3, node_configs=PHONES)
    strategy = make_strategy(config)
    result = strategy.start(grid, ArrayRecord(), num_rounds=strategy.settings.max_iterations)
    asked = {
        m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type == QUERY_DECNAS_LATENCY
    }
    assert asked == {grid.node_of_partition[p] for p in (0, 2)}
    gm0, *pruned = result.frontier
    assert pruned, "no GM_t: no layer could be pruned to the first budget"
    assert gm0.latency_ms is not None and gm0.latency_ms > 0
    s = strategy.settings
    previous = gm0.latency_ms
    for t, model in enumerate(pruned, start=1):
        expected = budget(
            previous, gm0.latency_ms, t, s.initial_reduction, s.decay, s.target * gm0.latency_ms
        )
        assert model.budget == pytest.approx(expected)
        assert model.latency_ms <= model.budget < previous
        previous = model.latency_ms
    summary = result.summary()
    assert summary["frontier"][0]["latency-ms"] == gm0.latency_ms
    assert summary["latency"]["device-class"] == "phone"
    assert summary["latency"]["target-nodes"] == [0, 2]
    assert result.train_metrics_clientapp[0]["latency-ms"] == pytest.approx(gm0.latency_ms)


def test_a_residual_and_concatenating_net_has_units_of_every_layer_feeding_them():
    from tests.search_spaces.test_prunable_user import SHAPE, TinyResNet

    net = build_prunable(TinyResNet, input_shape=SHAPE)
    layout = layer_layout(net.spec, points=2)
    deps = {u.name: u.deps for u in layout.units}
    assert deps["res"] == (0,)  # added back onto the stem: its width is the stem's
    assert deps["mix"] == (1, 2, 3)  # the two concatenated branches and its own filters
    assert deps["head"] == (4,)
    ones = LatencyTable(layout.spec, "cpu", 1, tuple((1.0,) * n for n in layout.num_options()), 0.0)
    assert predict_ms(ones, layout, net.widths) == pytest.approx(len(layout.units))


@pytest.mark.slow  # three runs through server_app.main (exports, checkpoints): about a minute
def test_a_resumed_run_by_latency_continues_on_the_same_table(data_cache, injected, tmp_path):
    from fedorasflwr.methods.decnas.messages import DECNAS_TUNE
    from tests.test_checkpoints import result_of, stopped_and_resumed

    base = latency_config(
        data_cache,
        **{
            "decnas.max-iterations": 2,
            "checkpoint-every": 1,
            "decnas.gm0-rounds": 0,
            "decnas.final-rounds": 0,
        },
    )
    whole, stopped, resumed = stopped_and_resumed(base, tmp_path, 3, DECNAS_TUNE, stop=2001)
    first, second = result_of(whole), result_of(resumed)
    assert [m["iteration"] for m in second["frontier"]] == [0, 1, 2]
    assert second["frontier"] == first["frontier"]
    assert second["history"] == first["history"]
    budgets = [m["budget"] for m in second["frontier"][1:]]
    latencies = [m["latency_ms"] for m in second["frontier"]]
    assert all(lat <= cap for lat, cap in zip(latencies[1:], budgets, strict=True))
    assert second["latency"]["target_nodes"] == list(range(3))
    nodes = second["latency"]["nodes"]
    assert [n["partition_id"] for n in nodes] == list(range(3))
    assert all("option_ms" not in n and n["fixed_ms"] == 0.1 for n in nodes)
    assert len(second["latency"]["table"]["option_ms"]) == len(second["latency"]["units"])
