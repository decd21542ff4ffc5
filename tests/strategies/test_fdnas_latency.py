"""FDNAS / CFDNAS with latency as the resource (``fdnas.resource = "latency"``): the expected
latency term against hand-computed values and its pull, the derivation within a target on
a table, per-cluster group tables from the nodes' own (injected) tables, the checks before
training, and CFDNAS end to end on the in-process grid."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

import fedorasflwr.latency as latency
from fedorasflwr.client_app import app as client_app
from fedorasflwr.config import parse_run_config
from fedorasflwr.export import OnnxExports
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.latency import LatencyRequest, LatencyTable
from fedorasflwr.methods.fdnas.client import hardware_loss, search_supernet
from fedorasflwr.methods.fdnas.hardware import (
    derive_within_ms,
    expected_latency,
    latency_config,
    path_range_ms,
)
from fedorasflwr.methods.fdnas.runner import cluster_tagger, run_cfdnas
from fedorasflwr.protocol import ARRAYS, CONFIG, METRICS, space_to_config
from fedorasflwr.search_spaces import build_space
from fedorasflwr.strategies import CFDNAS
from tests.runconfig import tiny_fdnas
from tests.strategies.test_fdnas import _synthetic_client

NUM_NODES = 10  # tiny_fdnas's class-group split: clusters 0 (0-2), 1 (3-5), 2 (6-9)
#: per torch thread count, the scale of every injected table entry; 3 threads: a bad table
SCALE = {1: 1.0, 2: 3.0}
QUICK = LatencyRequest(repeats=1, warmup=0, validation_paths=0, seed=0)


def tiny_space():
    return build_space("mbconv", width=0.25, layers_per_stage=1)  # 3 layers of 6 options


def known_table(space, scale: float = 1.0) -> LatencyTable:
    """Option ``o`` of every layer takes ``scale * 0.1 * (o + 1)`` ms, the fixed part
    ``scale * 0.2``: paths from ``0.5 scale`` to ``2.0 scale`` ms."""
    return LatencyTable(
        spec=space.spec,
        device="cpu",
        threads=torch.get_num_threads(),
        option_ms=tuple(
            tuple(scale * 0.1 * (o + 1) for o in range(n)) for n in space.num_options()
        ),
        fixed_ms=scale * 0.2,
    )


@pytest.fixture(autouse=True)
def injected_tables(tmp_path, monkeypatch):
    """Each node 'measures' the known table scaled by its torch threads (node config
    ``num-threads``); 3 threads give a table with a zero entry, which the server drops."""
    monkeypatch.setenv("FEDORASFLWR_CACHE", str(tmp_path / "cache"))

    def measure(space, request, *, device=None):
        threads = torch.get_num_threads()
        table = known_table(space, SCALE.get(threads, 1.0))
        if threads == 3:
            layers = [list(layer) for layer in table.option_ms]
            layers[0][0] = 0.0
            table = LatencyTable(table.spec, "cpu", 3, tuple(map(tuple, layers)), 0.2)
        return table

    monkeypatch.setattr(latency, "measure_and_validate", measure)


@pytest.fixture(scope="module")
def run_config(data_cache):
    return tiny_fdnas(
        data_cache,
        method="cfdnas",
        **{
            "fdnas.resource": "latency",
            "fdnas.target-ms": 1.5,
            "fdnas.cluster-target-ms": "1.0,1.8,0.9",
            "latency.repeats": 1,
            "latency.warmup": 0,
            "latency.validation-paths": 0,
            # a fifth of MNIST-5k on the clients, in few steps: the run is about the tables
            "data.server-fraction": 0.8,
            "fdnas.batch-size": 128,
        },
    )


def flat(table: LatencyTable) -> list[float]:
    return [v for layer in table.option_ms for v in layer]


def node_configs(threads_of_cluster: dict[int, int]) -> dict[int, dict[str, int]]:
    """Clusters 0 (partitions 0-2), 1 (3-5), 2 (6-9), each on its own thread count."""
    cluster = {p: 0 if p < 3 else 1 if p < 6 else 2 for p in range(NUM_NODES)}
    return {
        p: {"cluster": tag, "num-threads": threads_of_cluster[tag]} for p, tag in cluster.items()
    }


def make_strategy(config, **overrides):
    settings = parse_run_config(config)
    torch.manual_seed(settings.seed)
    return CFDNAS(
        space=tiny_space(),
        settings=settings.method_settings,
        seed=settings.seed,
        cluster_of=cluster_tagger(settings),
        latency_request=QUICK,
        **overrides,
    )


# --- the expected latency and its pull --------------------------------------------------------


def test_the_expected_latency_is_the_fixed_part_plus_each_layers_probability_weighted_options():
    space = tiny_space()
    with torch.no_grad():
        space.arch_parameters()[0].copy_(torch.tensor([math.log(2.0), 0, 0, 0, 0, 0]))
    option_ms = [[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [1.0] * 6, [0.5, 0.5, 0.5, 2.0, 2.0, 2.0]]
    # layer 0: p = (2, 1, 1, 1, 1, 1) / 7; layers 1 and 2 uniform
    by_hand = 0.25 + (2 * 1 + 2 + 3 + 4 + 5 + 6) / 7 + 1.0 + (3 * 0.5 + 3 * 2.0) / 6
    value = expected_latency(space, option_ms, 0.25)
    assert float(value.detach()) == pytest.approx(by_hand, rel=1e-6)
    assert float(hardware_loss(space, by_hand, 2.0, value).detach()) == pytest.approx(0.0, abs=1e-9)
    assert float(hardware_loss(space, by_hand / 2, 2.0, value).detach()) == pytest.approx(
        2.0 * math.log(2.0) ** 2, rel=1e-5
    )


def test_the_latency_gradient_pushes_alpha_towards_options_cheaper_on_the_table():
    space = tiny_space()
    table = known_table(space)
    # table costs fall with the option index in layer 1: the reverse of the FLOPs order
    option_ms = [list(layer) for layer in table.option_ms]
    option_ms[1] = option_ms[1][::-1]
    cost = expected_latency(space, option_ms, table.fixed_ms)
    hardware_loss(space, path_range_ms(table)[0], 1.0, cost).backward()
    for alpha, layer in zip(space.arch_parameters(), option_ms, strict=True):
        ms = torch.tensor(layer)
        assert torch.all((alpha.grad > 0) == (ms > ms.mean()))


def _expected_ms_after_search(target_ms: float) -> float:
    """One client's search (real client code, synthetic data) from the same supernet and
    seed, with the latency term towards ``target_ms`` on the known table."""
    torch.manual_seed(0)
    space = tiny_space()
    config = {
        "seed": 0,
        "server-round": 1,
        "local-epochs": 3,
        "batch-size": 16,
        "lr": 0.01,
        "momentum": 0.9,
        "weight-decay": 0.0,
        "alpha-lr": 0.05,
        "alpha-every": 1,
        "hardware-beta": 2.0,
        **latency_config(known_table(space), target_ms),
        **space_to_config(space.spec),
    }
    content = RecordDict({ARRAYS: ArrayRecord(space.state_dict()), CONFIG: ConfigRecord(config)})
    reply = search_supernet(content, _synthetic_client(), partition_id=0)
    return float(reply.metric_records[METRICS]["expected-ms"])


def test_a_lower_latency_target_gives_a_supernet_expecting_less_latency():
    start = float(expected_latency(tiny_space(), known_table(tiny_space()).option_ms, 0.2))
    low, high = (_expected_ms_after_search(t) for t in (0.6, 1.9))
    assert low < start < high


# --- derivation within a target -----------------------------------------------------------------


def test_the_derived_net_is_the_most_probable_path_within_the_target_on_the_table():
    space = tiny_space()
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for alpha in space.arch_parameters():
            alpha.copy_(torch.randn(alpha.shape, generator=generator))
    table = known_table(space)
    logp = [torch.log_softmax(a.detach().double(), 0).tolist() for a in space.arch_parameters()]
    argmax = tuple(int(a.argmax()) for a in space.arch_parameters())
    for bound in (0.5, 0.8, 1.1, 1.4, table.path_ms(argmax), 2.0):
        arch = derive_within_ms(space, table, bound)
        fitting = [
            path
            for path in itertools.product(*(range(n) for n in space.num_options()))
            if table.path_ms(path) <= bound + 1e-12
        ]
        best = max(fitting, key=lambda path: sum(logp[i][o] for i, o in enumerate(path)))
        assert arch == best and table.path_ms(arch) <= bound + 1e-12  # brute force agrees
    assert derive_within_ms(space, table, table.path_ms(argmax)) == argmax
    with pytest.raises(ValueError, match="no path fits in 0.4 ms"):
        derive_within_ms(space, table, 0.4)


# --- the run config -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"fdnas.resource": "time"}, r"'fdnas.resource' = 'time': allowed: one of flops, latency"),
        ({"fdnas.target-ms": 0.0}, r"'fdnas.target-ms' = 0.0: with 'fdnas.resource' = 'latency'"),
        ({"fdnas.target-ms": -1.0}, r"'fdnas.target-ms' = -1.0: allowed: > 0 ms"),
        ({"fdnas.cluster-target-ms": ""}, r"'fdnas.cluster-target-ms' = '': with"),
        ({"fdnas.cluster-target-ms": "1,x"}, r"'fdnas.cluster-target-ms' = '1,x': comma-sep"),
        ({"fdnas.cluster-target-ms": "1,-2"}, r"'fdnas.cluster-target-ms' = '1,-2': comma-sep"),
        ({"fdnas.max-flops": 0.5}, r"'fdnas.max-flops' = 0.5: with 'fdnas.resource' = 'lat"),
    ],
)
def test_a_bad_latency_key_is_refused_naming_key_value_and_what_is_allowed(
    run_config, overrides, message
):
    with pytest.raises(ValueError, match=message):
        parse_run_config({**run_config, **overrides})


def test_the_flops_resource_needs_no_latency_key(run_config):
    settings = parse_run_config(
        {**run_config, "fdnas.resource": "flops", "fdnas.cluster-target-ms": ""}
    )
    assert (
        settings.method_settings.resource == "flops"
        and settings.method_settings.cluster_target(0) == 0.35
    )


# --- group tables per cluster -------------------------------------------------------------------


def test_each_cluster_gets_its_nodes_table_and_the_search_its_median(run_config):
    strategy = make_strategy(run_config)
    grid = InProcessGrid(
        client_app, run_config, NUM_NODES, node_configs=node_configs({0: 1, 1: 2, 2: 2})
    )
    strategy.setup(grid)
    assert len(strategy.latency_tables) == NUM_NODES
    space = strategy.space
    one, three = known_table(space, 1.0), known_table(space, 3.0)
    assert strategy.stage_table("cluster-0", [0, 1, 2]).option_ms == one.option_ms
    assert flat(strategy.stage_table("cluster-1", [3, 4, 5])) == pytest.approx(flat(three))
    # 3 nodes at scale 1, 7 at scale 3: the median entry is scale 3's
    stage = strategy.whole_search()
    assert flat(stage.table) == pytest.approx(flat(three))
    assert stage.target == 1.5 and strategy.group_tables["search"] is stage.table
    message = next(
        iter(strategy.configure_train(1, ArrayRecord(space.state_dict()), ConfigRecord(), grid))
    )
    config = message.content.config_records[CONFIG]
    assert config["target-ms"] == 1.5 and "target-flops" not in config
    assert config["latency-option-ms"] == pytest.approx(flat(three))


def test_a_dropped_table_leaves_its_node_out_and_a_cluster_without_tables_falls_back(
    run_config, caplog
):
    strategy = make_strategy(run_config)
    configs = node_configs({0: 1, 1: 2, 2: 3})  # cluster 2's tables are all malformed
    configs[1]["num-threads"] = 3  # and one node of cluster 0
    grid = InProcessGrid(client_app, run_config, NUM_NODES, node_configs=configs)
    strategy.setup(grid)  # no crash
    dropped = {grid.node_of_partition[p] for p in (1, 6, 7, 8, 9)}
    assert set(strategy.latency_tables) == set(grid.node_of_partition.values()) - dropped
    for node in dropped:
        assert f"dropped reply of node {node}" in caplog.text
    cluster_0 = strategy.stage_table("cluster-0", [0, 1, 2])
    assert cluster_0.option_ms == known_table(strategy.space).option_ms
    assert "[cluster-0] latency: no table from partition(s) [1], left out" in caplog.text
    fallback = strategy.stage_table("cluster-2", [6, 7, 8, 9])
    assert "[cluster-2] no node has a latency table: the all-nodes table stands in" in caplog.text
    assert any(r.levelname == "WARNING" and "cluster-2" in r.getMessage() for r in caplog.records)
    # the all-nodes table of the 5 nodes with one: 2 at scale 1, 3 at scale 3
    assert flat(fallback) == pytest.approx(flat(known_table(strategy.space, 3.0)))


def test_a_cluster_target_no_net_meets_fails_before_any_training(run_config):
    config = {**run_config, "fdnas.cluster-target-ms": "1.0,1.2,0.9"}  # cluster 1: >= 1.5 ms
    strategy = make_strategy(config)
    grid = InProcessGrid(
        client_app, run_config, NUM_NODES, node_configs=node_configs({0: 1, 1: 2, 2: 1})
    )
    with pytest.raises(ValueError) as info:
        strategy.start(grid, ArrayRecord(), num_rounds=1)
    assert str(info.value).startswith(
        "run config 'fdnas.cluster-target-ms' = 1.2: no net of the space fits in it on the "
        "latency table of stage 'cluster-1' (paths take 1.5..6 ms); allowed: at least 1.5"
    )
    assert "search" not in strategy.ledger.summary()


# --- end to end ---------------------------------------------------------------------------------


def test_cfdnas_on_latency_gives_each_cluster_a_net_within_its_target_on_its_table(
    run_config, tmp_path, monkeypatch
):
    monkeypatch.setattr(OnnxExports, "add", lambda *args: None)  # (tested in test_export.py)
    settings = parse_run_config(run_config)
    grid = InProcessGrid(
        client_app, run_config, NUM_NODES, node_configs=node_configs({0: 1, 1: 2, 2: 1})
    )
    document = run_cfdnas(grid, settings, tmp_path)
    nets = {net["name"]: net for net in document["nets"]}
    assert list(nets) == ["fdnas", "cluster-0", "cluster-1", "cluster-2"]
    scale = {"fdnas": 1.0, "cluster-0": 1.0, "cluster-1": 3.0, "cluster-2": 1.0}
    target = {"fdnas": 1.5, "cluster-0": 1.0, "cluster-1": 1.8, "cluster-2": 0.9}
    space = tiny_space()
    for name, net in nets.items():
        assert net["target-ms"] == target[name]
        assert net["predicted-ms"] == pytest.approx(
            known_table(space, scale[name]).path_ms(net["arch"])
        )
        assert net["predicted-ms"] <= target[name] + 1e-9
    tables = document["latency-tables"]
    assert [n["partition-id"] for n in tables["nodes"]] == list(range(NUM_NODES))
    assert sorted(tables["groups"]) == ["cluster-0", "cluster-1", "cluster-2", "search"]
    assert tables["groups"]["cluster-1"]["min-path-ms"] == pytest.approx(1.5)
    for entry in document["search-history"] + document["cluster-history"][1]:
        assert np.isfinite(entry["expected-ms"]) and "derived-ms" in entry
