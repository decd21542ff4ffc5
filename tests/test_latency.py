"""Latency lookup tables (``fedorasflwr/latency.py``), the node's cached answer to
``query.latency`` and the strategy's ``query_latency``, on the in-process grid.

Wall-clock numbers are never compared with a constant: only structure and consistency.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import Counter
from typing import Any

import pytest
import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from torch.utils.data import TensorDataset

import fedorasflwr.latency as latency
from fedorasflwr.clients import make_client_app
from fedorasflwr.clients.latency import answer_latency, latency_cache_dir
from fedorasflwr.federation.base import FederatedNASStrategy
from fedorasflwr.inprocess import InProcessGrid, replace_content
from fedorasflwr.latency import (
    LatencyRequest,
    LatencyTable,
    measure_table,
    path_latency,
    sample_paths,
    spearman,
    validate,
)
from fedorasflwr.protocol import CONFIG, LATENCY, METRICS, QUERY_LATENCY, space_to_config
from fedorasflwr.search_spaces import build_space

QUICK = LatencyRequest(repeats=2, warmup=1, validation_paths=4, seed=0)


def tiny_space():
    return build_space(
        "cnn_s", num_classes=4, in_channels=1, input_height=8, input_width=8, width=0.25
    )


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """Every test its own node cache (``$FEDORASFLWR_CACHE``)."""
    monkeypatch.setenv("FEDORASFLWR_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def measurements(monkeypatch):
    """Counts the tables the node measures (its cache misses)."""
    counter: Counter[str] = Counter()
    measure = latency.measure_and_validate

    def counted(space, request, **kwargs):
        counter[space.spec["name"]] += 1
        return measure(space, request, **kwargs)

    monkeypatch.setattr(latency, "measure_and_validate", counted)
    return counter


# --- the table ------------------------------------------------------------------------------


def test_the_table_has_one_positive_entry_per_option_and_sums_paths():
    space = tiny_space()
    before = {k: v.clone() for k, v in space.state_dict().items()}
    table = measure_table(space, device="cpu", repeats=2, warmup=1)
    assert table.num_options() == space.num_options()
    flat = [v for layer in table.option_ms for v in layer]
    assert all(math.isfinite(v) and v > 0 for v in flat)
    assert math.isfinite(table.fixed_ms) and table.fixed_ms >= 0
    assert (table.device, table.threads) == ("cpu", torch.get_num_threads())
    assert table.spec == space.spec
    for arch in sample_paths(space, 5, 0, "latency-paths"):
        chosen = [table.option_ms[layer][o] for layer, o in enumerate(arch)]
        assert path_latency(table, arch) == pytest.approx(table.fixed_ms + sum(chosen))
        assert table.path_ms(arch) == path_latency(table, arch)
    assert space.training  # left as it was, weights untouched
    assert all(torch.equal(before[k], v) for k, v in space.state_dict().items())
    with pytest.raises(ValueError, match="entries"):
        path_latency(table, (0,))


def test_bad_counts_and_statistics_are_refused():
    with pytest.raises(ValueError, match="repeats"):
        LatencyRequest(repeats=0)
    with pytest.raises(ValueError, match="statistic 'mean' is unknown"):
        LatencyRequest(statistic="mean")
    with pytest.raises(ValueError, match="validation_paths"):
        LatencyRequest(validation_paths=-1)


def test_spearman_matches_scipy_with_ties():
    stats = pytest.importorskip("scipy.stats")
    a = [3.0, 1.0, 2.0, 2.0, 5.0, 4.0, 4.0]
    b = [1.0, 0.5, 0.7, 0.9, 3.0, 2.0, 2.5]
    assert spearman(a, b) == pytest.approx(stats.spearmanr(a, b).statistic)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_validation_compares_the_table_with_measured_subnets():
    space = tiny_space()
    table = measure_table(space, device="cpu", repeats=2, warmup=1)
    paths = sample_paths(space, 6, 0, "latency-paths")
    check = validate(table, space, paths)
    assert check.paths == len(check.measured_ms) == len(check.predicted_ms) == 6
    assert list(check.predicted_ms) == [path_latency(table, a) for a in paths]
    assert all(m > 0 for m in check.measured_ms)
    assert -1 <= check.spearman_rho <= 1 or math.isnan(check.spearman_rho)
    assert 0 <= check.relative_error <= check.relative_error_p90


# --- the node: its reply and its cache ----------------------------------------------------


def query(space, request: LatencyRequest = QUICK) -> RecordDict:
    config = ConfigRecord({**request.to_config(), **space_to_config(space.spec)})
    return RecordDict({CONFIG: config})


def test_the_node_replies_with_its_table_and_measures_it_once(measurements, cache_dir):
    space = tiny_space()
    first = answer_latency(query(space))
    metrics, config = first.metric_records[METRICS], first.config_records[LATENCY]
    assert len(metrics[latency.OPTION_MS]) == sum(space.num_options())
    assert metrics[latency.MEASURED] == 1 and metrics[latency.THREADS] == torch.get_num_threads()
    assert metrics[latency.VALIDATION_PATHS] == QUICK.validation_paths
    for name in (latency.SPEARMAN_RHO, latency.RELATIVE_ERROR, latency.RELATIVE_ERROR_P90):
        assert name in metrics
    assert latency.latency_problem(metrics, config, space.num_options()) is None
    second = answer_latency(query(space))
    assert second.metric_records[METRICS][latency.MEASURED] == 0
    again = dict(second.metric_records[METRICS])
    assert again.pop(latency.MEASURED) == 0
    assert again == {k: v for k, v in metrics.items() if k != latency.MEASURED}
    assert measurements == {"cnn_s": 1}
    assert len(list(latency_cache_dir().glob("*.json"))) == 1
    # another request (no validation) is another table
    answer_latency(query(space, LatencyRequest(repeats=2, warmup=1, validation_paths=0)))
    assert measurements == {"cnn_s": 2}


def test_processes_asking_at_once_share_one_measurement(measurements, monkeypatch):
    # the simulation engine's workers answer several nodes of one host at the same time:
    # the first takes the cache file's lock and measures, the others read its table
    measure = latency.measure_and_validate

    def slow(space, request, **kwargs):
        time.sleep(0.5)  # long enough for every asker to arrive while it measures
        return measure(space, request, **kwargs)

    monkeypatch.setattr(latency, "measure_and_validate", slow)
    start = threading.Barrier(3)
    replies: list[RecordDict] = []

    def ask() -> None:
        start.wait()
        replies.append(answer_latency(query(tiny_space())))

    askers = [threading.Thread(target=ask) for _ in range(3)]
    for asker in askers:
        asker.start()
    for asker in askers:
        asker.join(timeout=60)
    assert measurements == {"cnn_s": 1}
    tables = [r.metric_records[METRICS][latency.OPTION_MS] for r in replies]
    assert len(tables) == 3 and tables[1:] == tables[:-1]
    assert sorted(r.metric_records[METRICS][latency.MEASURED] for r in replies) == [0, 0, 1]


def test_the_cache_is_keyed_by_threads(measurements):
    space = tiny_space()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = answer_latency(query(space)).metric_records[METRICS]
        torch.set_num_threads(2)
        two = answer_latency(query(space)).metric_records[METRICS]
    finally:
        torch.set_num_threads(threads)
    assert (one[latency.THREADS], two[latency.THREADS]) == (1, 2)
    assert measurements == {"cnn_s": 2}


@pytest.mark.parametrize(
    "damage",
    [
        lambda text: text[: len(text) // 2],  # cut
        lambda text: text.replace('"fixed-ms": ', '"fixed-ms": 1', 1),  # digest mismatch
        lambda text: "[]",  # not a table
    ],
)
def test_a_damaged_cache_file_is_measured_again(measurements, damage, caplog):
    space = tiny_space()
    answer_latency(query(space))
    (path,) = latency_cache_dir().glob("*.json")
    path.write_text(damage(path.read_text()))
    reply = answer_latency(query(space))
    assert reply.metric_records[METRICS][latency.MEASURED] == 1
    assert measurements == {"cnn_s": 2}
    assert f"latency cache {path}" in caplog.text
    json.loads(path.read_text())  # written again, whole


# --- the strategy: once per node, replies screened -----------------------------------------


class Probe(FederatedNASStrategy):
    """The shared base alone (no method)."""

    def configure_train(self, *args: Any) -> list[Message]:
        return []

    def aggregate_train(self, *args: Any) -> None:
        return None

    def summary(self) -> None:
        return None


def load_data(context: Context) -> tuple[TensorDataset, TensorDataset, TensorDataset]:
    pid = int(context.node_config["partition-id"])
    x, y = torch.zeros(6 + pid, 1, 8, 8), torch.arange(6 + pid) % 4
    return TensorDataset(x, y), TensorDataset(x[:2], y[:2]), TensorDataset(x[:2], y[:2])


def grid_of(num_nodes: int, **kwargs: Any) -> InProcessGrid:
    return InProcessGrid(make_client_app(load_data, num_classes=4), {}, num_nodes, **kwargs)


def profiled(grid: InProcessGrid) -> Probe:
    strategy = Probe(seed=0, min_replies=1, min_nodes=1)
    strategy.profile_nodes(grid, ConfigRecord({"method": "probe"}))
    return strategy


def test_each_node_is_asked_once_on_its_own_threads(measurements):
    threads = torch.get_num_threads()
    grid = grid_of(2, node_configs={0: {"num-threads": 1}, 1: {"num-threads": 2}})
    strategy = profiled(grid)
    space = tiny_space()
    try:
        tables = strategy.query_latency(grid, space, request=QUICK)
        again = strategy.query_latency(grid, space, request=QUICK)
    finally:
        torch.set_num_threads(threads)
    node = grid.node_of_partition
    assert sorted(tables) == sorted(node.values()) and again == {}
    assert (tables[node[0]].threads, tables[node[1]].threads) == (1, 2)
    assert strategy.latency_tables == tables
    for table in tables.values():
        assert table.num_options() == space.num_options() and table.spec == space.spec
        assert table.validation is not None and table.validation.paths == QUICK.validation_paths
    sent = Counter(m.metadata.message_type for m in grid.sent)
    assert sent[QUERY_LATENCY] == 2
    assert measurements == {"cnn_s": 2}  # one per thread count
    totals = strategy.ledger.stage_totals("latency")
    assert (totals.messages, totals.replies, totals.rejected) == (2, 2, 0)


def altered(change):
    """A grid fault replacing the node's latency metrics by ``change(metrics)``."""

    def fault(reply: Message) -> Message:
        if reply.metadata.message_type != QUERY_LATENCY:
            return reply
        content = reply.content
        metrics = dict(content.metric_records[METRICS])
        records = {METRICS: MetricRecord(change(metrics))}
        if LATENCY in content.config_records:
            records[LATENCY] = content.config_records[LATENCY]
        return replace_content(reply, RecordDict(records))

    return fault


def _negative(metrics):
    values = list(metrics[latency.OPTION_MS])
    values[1] = -values[1]
    return {**metrics, latency.OPTION_MS: values}


def _nan(metrics):
    return {**metrics, latency.FIXED_MS: math.nan}


def _short(metrics):
    return {**metrics, latency.OPTION_MS: list(metrics[latency.OPTION_MS])[:-1]}


def _rho(metrics):
    return {**metrics, latency.SPEARMAN_RHO: 1.5}


def _rho_list(metrics):
    return {**metrics, latency.SPEARMAN_RHO: [0.5, 0.5]}


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (_negative, "'option-ms' has an entry that is not a finite number > 0"),
        (_nan, "metric 'fixed-ms' is not finite"),
        (_short, "'option-ms' has"),
        (_rho, "'spearman-rho' = 1.5 is not within [-1, 1]"),
        (_rho_list, "'spearman-rho' = [0.5, 0.5] is not within [-1, 1]"),
    ],
)
def test_a_bad_table_is_dropped_naming_the_node(change, reason, caplog):
    grid = grid_of(2, faults={1: altered(change)})
    strategy = profiled(grid)
    tables = strategy.query_latency(grid, tiny_space(), request=QUICK)
    bad, good = grid.node_of_partition[1], grid.node_of_partition[0]
    assert sorted(tables) == [good]
    assert f"[latency] dropped reply of node {bad}: " in caplog.text
    assert reason in caplog.text
    assert strategy.ledger.node("latency", bad).rejected == 1


def test_a_bad_request_is_an_error_naming_the_key():
    content = query(tiny_space())
    content[CONFIG] = ConfigRecord({**dict(content.config_records[CONFIG]), "repeats": 0})
    with pytest.raises(ValueError, match="repeats must be an integer >= 1"):
        answer_latency(content)


def test_a_table_without_its_device_record_is_dropped(caplog):
    def strip(reply: Message) -> Message:
        if reply.metadata.message_type != QUERY_LATENCY:
            return reply
        metrics = reply.content.metric_records[METRICS]
        return replace_content(reply, RecordDict({METRICS: metrics}))

    grid = grid_of(2, faults={0: strip})
    strategy = profiled(grid)
    tables = strategy.query_latency(grid, tiny_space(), request=QUICK)
    bad = grid.node_of_partition[0]
    assert sorted(tables) == [grid.node_of_partition[1]]
    assert f"dropped reply of node {bad}: no ConfigRecord 'latency'" in caplog.text


# --- a group's table, the run config and the profile ------------------------------------------


def _table(option_ms, fixed_ms, device="cpu", threads=1):
    return LatencyTable(
        spec={"name": "cnn_s"},
        device=device,
        threads=threads,
        option_ms=tuple(tuple(layer) for layer in option_ms),
        fixed_ms=fixed_ms,
    )


def test_a_groups_table_is_the_median_of_its_members_per_entry():
    tables = [
        _table([[1.0, 2.0], [3.0]], 0.5),
        _table([[2.0, 9.0], [1.0]], 0.1, threads=2),
        _table([[4.0, 3.0], [2.0]], 0.3),
    ]
    group = latency.group_table(tables)
    assert group.option_ms == ((2.0, 3.0), (2.0,))
    assert group.fixed_ms == 0.3 and group.threads == 1
    assert group.path_ms([1, 0]) == pytest.approx(0.3 + 3.0 + 2.0)
    assert latency.group_table(tables[:1]) is tables[0]
    with pytest.raises(ValueError, match="no latency table"):
        latency.group_table([])
    with pytest.raises(ValueError, match="different spaces"):
        latency.group_table([tables[0], _table([[1.0]], 0.1)])


def test_the_latency_keys_of_the_run_config_become_the_request():
    from fedorasflwr.config import parse_run_config

    settings = parse_run_config({"seed": 7, "latency.statistic": "min", "latency.repeats": 3})
    assert settings.latency.request(settings.seed) == LatencyRequest(
        repeats=3, warmup=5, statistic="min", validation_paths=20, seed=7
    )
    with pytest.raises(ValueError, match=r"'latency.statistic' = 'mean': allowed: one of"):
        parse_run_config({"latency.statistic": "mean"})
    with pytest.raises(ValueError, match=r"'latency.repeats' = 0: allowed: 1..1000"):
        parse_run_config({"latency.repeats": 0})


def test_a_node_declares_its_device_class_and_budget_and_a_bad_budget_is_dropped(caplog):
    from fedorasflwr.runs import latency_document

    configs = {
        0: {"device-class": "phone", "latency-budget-ms": 2.5},
        1: {},
        2: {"latency-budget-ms": -1.0},
    }
    grid = grid_of(3, node_configs=configs)
    strategy = Probe(seed=0, min_replies=1, min_nodes=1)
    profiles = strategy.profile_nodes(grid, ConfigRecord({"method": "probe"}))
    node = grid.node_of_partition
    assert sorted(profiles) == sorted([node[0], node[1]])
    assert (profiles[node[0]].device_class, profiles[node[0]].latency_budget_ms) == ("phone", 2.5)
    assert (profiles[node[1]].device_class, profiles[node[1]].latency_budget_ms) == ("", 0.0)
    assert f"node {node[2]}" in caplog.text and "latency-budget-ms = -1.0" in caplog.text
    table = _table([[1.0, 2.0]], 0.5)
    doc = latency_document(profiles, {node[0]: table})
    (entry,) = doc["nodes"]
    assert entry["device-class"] == "phone" and entry["latency-budget-ms"] == 2.5
    assert (entry["min-path-ms"], entry["max-path-ms"]) == (1.5, 2.5)
