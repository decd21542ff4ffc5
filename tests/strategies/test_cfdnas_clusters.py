"""CFDNAS forms its clusters by itself: with the default ``cluster_of=None`` the strategy
splits the partitions into ``fdnas.num-clusters`` contiguous ranges (the runner uses the same
function), a declared ``cluster`` still wins, the clusters are logged, and a count mismatch is
refused after profiling, before any training, with the reason and the fix."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch
from flwr.app import ArrayRecord

from fedorasflwr.client_app import app as client_app
from fedorasflwr.clients import make_client_app
from fedorasflwr.config import parse_run_config
from fedorasflwr.federation.base import NodeProfile
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.methods.fdnas.clusters import (
    bounded_cluster,
    cluster_ranges,
    contiguous_cluster,
    rank_bounds,
)
from fedorasflwr.methods.fdnas.messages import FDNAS_SEARCH, FDNAS_TRAIN
from fedorasflwr.methods.fdnas.runner import cluster_tagger
from fedorasflwr.search_spaces import build_space
from fedorasflwr.strategies import CFDNAS
from tests.runconfig import tiny_fdnas

NUM_NODES = 6


@pytest.fixture(scope="module")
def run_config(data_cache):
    """Tiny CFDNAS on iid partitions (no class groups to cluster by), two clusters."""
    return tiny_fdnas(
        data_cache, **{"method": "cfdnas", "data.partitioner": "iid", "fdnas.num-clusters": 2}
    )


def cfdnas(config, **overrides):
    """CFDNAS as a library user builds it: no ``cluster_of``."""
    settings = parse_run_config(config)
    torch.manual_seed(settings.seed)
    space = build_space("mbconv", width=0.25, layers_per_stage=1)
    return CFDNAS(space=space, settings=settings.method_settings, seed=settings.seed, **overrides)


def trained(grid) -> bool:
    """Whether any search or training message went out."""
    return any(m.metadata.message_type in (FDNAS_SEARCH, FDNAS_TRAIN) for m in grid.sent)


# --- the rule -------------------------------------------------------------------------------


def test_contiguous_ranges_are_near_equal_with_the_remainder_last():
    assert cluster_ranges(10, 3) == [range(0, 3), range(3, 6), range(6, 10)]
    assert cluster_ranges(6, 2) == [range(0, 3), range(3, 6)]
    assert [contiguous_cluster(p, 10, 3) for p in range(10)] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 2]
    assert cluster_ranges(2, 3) == [range(0, 0), range(0, 1), range(1, 2)]  # one left empty
    with pytest.raises(ValueError, match=r"partition-id = 10 is outside 0\.\.9"):
        contiguous_cluster(10, 10, 3)
    with pytest.raises(ValueError, match="num_clusters = 0: allowed: an integer >= 1"):
        cluster_ranges(10, 0)


def test_the_default_tag_ignores_node_ids_arrival_order_and_seed(run_config):
    profile = NodeProfile(0, 0, NUM_NODES, 10, 2, 2, (1,) * 10)
    profiles = [replace(profile, partition_id=p, node_id=1000 + p) for p in range(NUM_NODES)]
    tags = []
    for seed, node_base in ((0, 1000), (1, 77), (2, 5)):
        strategy = cfdnas({**run_config, "seed": seed})
        shuffled = [replace(p, node_id=node_base + 13 * p.partition_id) for p in profiles]
        random.Random(seed).shuffle(shuffled)
        tags.append({p.partition_id: strategy._cluster_tag(p) for p in shuffled})
    assert tags[0] == tags[1] == tags[2] == {0: 0, 1: 0, 2: 0, 3: 1, 4: 1, 5: 1}


def test_unknown_num_partitions_split_the_profiled_ids_by_rank():
    ids = [907, 12, 5_000, 44, 3_001, 640]  # data-derived ids, num-partitions = 0
    bounds = rank_bounds(ids, 2)
    assert bounds == [907]  # sorted: 12, 44, 640 | 907, 3001, 5000
    tags = {i: bounded_cluster(i, bounds) for i in ids}
    assert tags == {12: 0, 44: 0, 640: 0, 907: 1, 3_001: 1, 5_000: 1}
    assert [bounded_cluster(i, rank_bounds(ids, 3)) for i in sorted(ids)] == [0, 0, 1, 1, 2, 2]
    assert bounded_cluster(900, bounds) == 0 and bounded_cluster(10**6, bounds) == 1  # late ids
    assert rank_bounds([7], 2) == [7]  # fewer ids than clusters: the first left empty


def test_a_library_app_without_partition_ids_still_gets_num_clusters_clusters(run_config):
    def load_data(context):  # a user's own data, no partition id in the node config
        generator = torch.Generator().manual_seed(context.node_id)
        images = torch.rand(30, 1, 28, 28, generator=generator)
        labels = torch.randint(0, 10, (30,), generator=generator)
        split = torch.utils.data.TensorDataset(images, labels)
        return split, split, split

    grid = InProcessGrid(make_client_app(load_data, num_classes=10), run_config, NUM_NODES)
    for context in grid.contexts.values():
        del context.node_config["partition-id"], context.node_config["num-partitions"]
    strategy = cfdnas(run_config)
    strategy.setup(grid)
    ids = sorted(strategy.cluster_of_partition)
    assert all(p.num_partitions == 0 for p in strategy.profiles.values())
    assert [strategy.cluster_of_partition[i] for i in ids] == [0, 0, 0, 1, 1, 1]


# --- default construction on the in-process grid -----------------------------------------------


def test_default_construction_forms_num_clusters_clusters_and_logs_them(run_config, caplog):
    strategy = cfdnas(run_config)
    strategy.setup(InProcessGrid(client_app, run_config, NUM_NODES))
    assert strategy.cluster_of_partition == {0: 0, 1: 0, 2: 0, 3: 1, 4: 1, 5: 1}
    assert (
        "CFDNAS clusters ('fdnas.num-clusters' = 2 contiguous ranges of partition ids): "
        "0: [0, 1, 2]; 1: [3, 4, 5]"
    ) in caplog.text


def test_a_declared_cluster_still_wins_over_the_default(run_config, caplog):
    declared = {p: {"cluster": 1 - p % 2} for p in range(NUM_NODES)}
    strategy = cfdnas(run_config)
    strategy.setup(InProcessGrid(client_app, run_config, NUM_NODES, node_configs=declared))
    assert strategy.cluster_of_partition == {p: 1 - p % 2 for p in range(NUM_NODES)}
    assert "declared in the node config 'cluster' of partition(s) [0, 1, 2, 3, 4, 5]" in (
        caplog.text
    )


def test_the_runner_and_the_library_share_the_rule(run_config, caplog):
    settings = parse_run_config(run_config)
    assert cluster_tagger(settings) is None  # not class-groups: the strategy's own rule
    grouped = parse_run_config({**run_config, "data.partitioner": "class-groups"})
    tag = cluster_tagger(grouped)
    assert (
        "run config 'fdnas.num-clusters' = 2 is not used: with 'data.partitioner' = "
        "'class-groups' the clusters are the 3 class groups"
    ) in caplog.text
    assert tag.rule == "the 3 class groups of 'data.partitioner' = 'class-groups'"
    profile = NodeProfile(0, 0, 10, 10, 2, 2, (1,) * 10)
    tags = [tag(replace(profile, partition_id=p)) for p in range(10)]
    assert tags == [contiguous_cluster(p, 10, 3) for p in range(10)]


def test_default_clusters_train_their_own_nets_with_their_own_curves(run_config):
    strategy = cfdnas(run_config)
    grid = InProcessGrid(client_app, run_config, NUM_NODES)
    result = strategy.start(grid, ArrayRecord(), num_rounds=1)
    nets = {net.name: net for net in result.nets}
    assert list(nets) == ["fdnas", "cluster-0", "cluster-1"]
    assert nets["fdnas"].partitions == list(range(NUM_NODES))
    assert nets["cluster-0"].partitions == [0, 1, 2]
    assert nets["cluster-1"].partitions == [3, 4, 5]
    assert sorted(result.cluster_history) == [0, 1]

    def curve(history, key):
        return [entry[key] for entry in history]

    # each cluster searched on its own clients: its own search and training curves
    search = [curve(result.cluster_history[t], "train-loss") for t in (0, 1)]
    assert search[0] != search[1]
    final = {name: curve(net.history, "train-loss") for name, net in nets.items()}
    assert len({tuple(c) for c in final.values()}) == 3
    assert nets["cluster-0"].test_accuracy.keys() != nets["cluster-1"].test_accuracy.keys()


# --- mismatches, refused before any training ------------------------------------------------------


def test_two_targets_for_the_default_three_clusters_are_refused_with_the_fix(run_config):
    config = {**run_config, "fdnas.num-clusters": 3, "fdnas.cluster-target-flops": "0.3,0.4"}
    grid = InProcessGrid(client_app, config, NUM_NODES)
    with pytest.raises(ValueError) as refused:
        cfdnas(config).start(grid, ArrayRecord(), num_rounds=1)
    assert str(refused.value) == (
        "run config 'fdnas.cluster-target-flops' has 2 value(s) for 3 cluster(s) [0, 1, 2] "
        "(formed by 'fdnas.num-clusters' = 3 contiguous ranges of partition ids): give one "
        "value for every cluster, or one per cluster in tag order, or set "
        "'fdnas.num-clusters' = 2"
    )
    assert not trained(grid)


def test_targets_that_do_not_match_declared_clusters_name_the_declaring_nodes(run_config):
    config = {**run_config, "fdnas.cluster-target-flops": "0.3,0.4"}
    declared = {p: {"cluster": p % 3} for p in range(NUM_NODES)}
    grid = InProcessGrid(client_app, config, NUM_NODES, node_configs=declared)
    with pytest.raises(ValueError, match=r"has 2 value\(s\) for 3 cluster\(s\) \[0, 1, 2\] "):
        cfdnas(config).start(grid, ArrayRecord(), num_rounds=1)
    assert not trained(grid)


def test_fewer_nodes_than_clusters_are_refused(run_config):
    config = {**run_config, "fdnas.num-clusters": 4}
    grid = InProcessGrid(client_app, config, 3)
    with pytest.raises(ValueError) as refused:
        cfdnas(config).start(grid, ArrayRecord(), num_rounds=1)
    assert str(refused.value) == (
        "run config 'fdnas.num-clusters' = 4: only 3 node(s) were profiled (partitions "
        "[0, 1, 2]) and every cluster needs one: set 'fdnas.num-clusters' to at most 3, "
        "start more nodes, or declare each node's cluster in its node config ('cluster=<tag>')"
    )
    assert not trained(grid)


def test_a_cluster_without_a_node_is_refused(run_config):
    # 4 nodes hold partitions 0-3 of 10: the third range (6-9) has none
    config = {**run_config, "fdnas.num-clusters": 3}
    of_ten = {p: {"num-partitions": 10} for p in range(4)}
    grid = InProcessGrid(client_app, config, 4, node_configs=of_ten)
    with pytest.raises(ValueError) as refused:
        cfdnas(config).start(grid, ArrayRecord(), num_rounds=1)
    assert str(refused.value) == (
        "run config 'fdnas.num-clusters' = 3: cluster 2 (partition ids 6..9 of "
        "num-partitions = 10) has no node (profiled: partitions [0, 1, 2, 3]): start a node "
        "for one of them, lower 'fdnas.num-clusters', or declare each node's cluster in its "
        "node config ('cluster=<tag>')"
    )
    assert not trained(grid)
