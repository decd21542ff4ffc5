"""Profiles are checked on arrival (``ProfileRules``), in the shared layer: a bad one drops
its node with a logged reason naming the node and the field, never the run; nodes that
appear mid-run are profiled before the next sampling step; DecNAS's grouping bounds a
node declaring an implausible size."""

from __future__ import annotations

import logging

import pytest
from flwr.app import ArrayRecord, ConfigRecord

from fedorasflwr.client_app import app as client_app
from fedorasflwr.config import parse_run_config
from fedorasflwr.federation.base import NodeProfile
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.methods.decnas.grouping import group_clients
from fedorasflwr.methods.decnas.runner import build_decnas_net
from fedorasflwr.methods.decnas.strategy import DecNAS
from fedorasflwr.methods.dpfnas.strategy import DPFNAS
from fedorasflwr.methods.fedoras.strategy import FedorAS
from fedorasflwr.runs import build_supernet
from tests.reliability.catalog import PROFILE_FAULTS, profile_fault
from tests.runconfig import tiny_decnas, tiny_fedoras
from tests.strategies.test_dpfnas_strategy import tiny_dpfnas

NUM_NODES = 6
BAD = 0  # the partition whose node lies

#: kind -> the field its log line must name
FIELD = {
    "negative-count": "num-val",
    "fractional-count": "num-train",
    "bool-count": "num-test",
    "missing-field": "num-train",
    "label-counts-not-a-list": "label-counts",
    "zero-train": "num-train",
    "other-label-length": "label-counts",
    "negative-label-count": "label-counts",
    "inflated-train": "label-counts",
    "labels-not-adding-up": "label-counts",
    "partition-out-of-range": "partition-id",
    "other-num-partitions": "num-partitions",
    "infinite-tier": "tier = inf",
    "fractional-cluster": "cluster = 0.5",
}


@pytest.fixture(scope="module")
def fedoras_config(data_cache):
    return tiny_fedoras(
        data_cache, **{"fedoras.clients-per-round": 3, "fedoras.search-scoring": "federated"}
    )


def fedoras(config) -> FedorAS:
    settings = parse_run_config(config)
    return FedorAS(space=build_supernet(settings), settings=settings.method_settings, seed=0)


def decnas(config) -> DecNAS:
    settings = parse_run_config(config)
    return DecNAS(net=build_decnas_net(settings), settings=settings.method_settings, seed=0)


def test_every_kind_of_profile_fault_has_a_field():
    assert set(FIELD) == set(PROFILE_FAULTS)


@pytest.mark.parametrize("kind", sorted(PROFILE_FAULTS))
def test_a_bad_profile_drops_its_node_naming_the_field(fedoras_config, caplog, kind):
    grid = InProcessGrid(client_app, fedoras_config, NUM_NODES, faults={BAD: profile_fault(kind)})
    strategy = fedoras(fedoras_config)
    with caplog.at_level(logging.WARNING):
        strategy.setup(grid)
    liar = grid.node_of_partition[BAD]
    assert set(strategy.profiles) == set(grid.contexts) - {liar}
    lines = [r.getMessage() for r in caplog.records if f"node {liar}" in r.getMessage()]
    assert any(FIELD[kind] in line for line in lines), lines
    assert strategy.ledger.stage_totals("profile").rejected == 1
    # the run goes on: a round samples among the others
    messages = strategy.configure_train(1, ArrayRecord(strategy.space.state_dict()), {}, grid)
    assert messages and liar not in {m.metadata.dst_node_id for m in messages}


def test_the_rules_one_by_one():
    from fedorasflwr.federation.base import ProfileRules

    honest = NodeProfile(1, 2, 5, 4, 1, 1, (1, 3, 0))
    rules = ProfileRules(num_classes=3)
    assert rules.problem(honest, 5) is None
    cases = {
        "num-train = 0": NodeProfile(1, 2, 5, 0, 1, 1, (0, 0, 0)),
        "num-partitions = 5: the other nodes declare 6": honest,
        "partition-id = 5: must be in [0, num-partitions = 5)": NodeProfile(
            1, 5, 5, 4, 1, 1, (1, 3, 0)
        ),
        "label-counts has 4 entries: the run's task has 3 classes": NodeProfile(
            1, 2, 5, 4, 1, 1, (1, 3, 0, 0)
        ),
        "label-counts sum to 5: num-train = 4 makes 4": NodeProfile(1, 2, 5, 4, 1, 1, (2, 3, 0)),
    }
    for expected, profile in cases.items():
        others = 6 if "declare 6" in expected else 5
        assert expected in (rules.problem(profile, others) or "")
    # text: a target per character of a window
    text = ProfileRules.of_spec({"vocab_size": 3, "seq_len": 2})
    assert text.problem(NodeProfile(1, 2, 5, 2, 1, 1, (1, 3, 0)), 5) is None
    assert "num-train = 4 x 2 makes 8" in text.problem(honest, 5)
    # DP-FNAS needs validation data; unknown partition counts (0) skip the range
    assert "num-val = 0" in ProfileRules(min_val=1).problem(
        NodeProfile(1, 2, 5, 4, 0, 1, (1, 3, 0)), 5
    )
    assert ProfileRules().problem(NodeProfile(1, 10**9, 0, 4, 0, 1, (4,)), 0) is None


def test_a_decnas_node_with_another_label_length_is_dropped_not_a_crash(data_cache, caplog):
    config = tiny_decnas(data_cache)
    faults = {BAD: profile_fault("other-label-length")}
    grid = InProcessGrid(client_app, config, NUM_NODES, faults=faults)
    strategy = decnas(config)
    with caplog.at_level(logging.WARNING):
        strategy.profile_nodes(grid, ConfigRecord({"method": "decnas"}))
        summary = strategy.regroup(grid, 1)
    liar = grid.node_of_partition[BAD]
    assert f"node {liar}: profile refused: label-counts has 11 entries" in caplog.text
    assert sorted(pid for group in summary["groups"] for pid in group) == [1, 2, 3, 4, 5]
    honest = InProcessGrid(
        client_app, config, NUM_NODES, faults={BAD: profile_fault("zero-train", silent=True)}
    )
    reference = decnas(config)
    reference.profile_nodes(honest, ConfigRecord({"method": "decnas"}))
    assert reference.regroup(honest, 1)["groups"] == summary["groups"]


def test_decnas_groups_bound_a_node_declaring_an_implausible_size():
    """A liar whose counts add up: declaring 10^6 samples moves the honest nodes' groups no
    more than declaring PLAUSIBLE_FACTOR x the median would (it weighs as that bound);
    unbounded, it sits alone in a group and the honest nodes are regrouped into the rest."""
    from fedorasflwr.methods.decnas.grouping import PLAUSIBLE_FACTOR, clip_declared

    sizes = [122, 111, 105, 93, 95, 82, 83, 80, 88, 120, 112, 125, 105, 110, 128, 116, 111]
    sizes += [107, 107, 126]
    firsts = [22, 65, 53, 0, 31, 68, 44, 2, 61, 58, 67, 14, 7, 69, 1, 43, 6, 23, 38, 33]
    labels = [[a, n - a] for a, n in zip(firsts, sizes, strict=True)]
    bound = int(PLAUSIBLE_FACTOR * 110)  # 110: the median of the 21 declared sizes

    def groups_with(liar: int) -> list[list[int]]:
        clipped, histograms, _ = clip_declared([*sizes, liar], [*labels, [liar, 0]])
        return group_clients(clipped, histograms, 4, 1.1)

    assert groups_with(10**6) == groups_with(10**9) == groups_with(bound)
    assert [20] not in groups_with(10**6)  # the liar shares its group
    unbounded = group_clients([*sizes, 10**6], [*labels, [10**6, 0]], 4, 1.1)
    assert [20] in unbounded and unbounded != groups_with(bound)
    clipped, histograms, cut = clip_declared([*sizes, 10**6], [*labels, [10**6, 0]])
    assert cut == [20] and clipped[20] == bound and histograms[20] == [bound, 0]
    assert clipped[:20] == sizes and histograms[:20] == labels


def test_a_dpfnas_party_without_training_data_is_dropped_not_the_run(data_cache, caplog):
    config = tiny_dpfnas(data_cache, **{"dpfnas.iterations": 1, "dpfnas.final-rounds": 0})
    settings = parse_run_config(config)
    faults = {0: profile_fault("zero-train")}
    grid = InProcessGrid(client_app, config, 3, faults=faults)
    strategy = DPFNAS(space=build_supernet(settings), settings=settings.method_settings, seed=0)
    with caplog.at_level(logging.WARNING):
        strategy.setup(grid)
    assert [p.partition_id for p in strategy.parties] == [1, 2]
    assert f"node {grid.node_of_partition[0]}: profile refused: num-train = 0" in caplog.text


# --- nodes that appear mid-run -------------------------------------------------------------


def sampled_partitions(strategy, grid, server_round=1) -> list[int]:
    arrays = ArrayRecord(strategy.space.state_dict())
    messages = strategy.configure_train(server_round, arrays, ConfigRecord(), grid)
    partition_of = {p.node_id: p.partition_id for p in strategy.profiles.values()}
    return sorted(partition_of[m.metadata.dst_node_id] for m in messages)


def test_a_node_that_reconnects_under_a_new_id_takes_its_partition_over(fedoras_config, caplog):
    grid = InProcessGrid(client_app, fedoras_config, NUM_NODES)
    strategy = fedoras(fedoras_config)
    strategy.setup(grid)
    reference = [sampled_partitions(strategy, grid, r) for r in (1, 2, 3)]
    old = grid.node_of_partition[3]
    grid.remove_node(old)
    new = grid.add_node(3)
    with caplog.at_level(logging.INFO):
        again = [sampled_partitions(strategy, grid, r) for r in (1, 2, 3)]
    assert new in strategy.profiles and old not in strategy.profiles
    assert strategy.profiles[new].partition_id == 3
    assert f"node {new} takes over partition 3 from node {old} (gone)" in caplog.text
    assert again == reference  # same seed, same partitions, whatever the node ids
    assert (
        sum(
            1
            for m in grid.sent
            if m.metadata.dst_node_id == new and "profile" in m.metadata.message_type
        )
        == 1
    )


def test_a_node_that_is_gone_leaves_its_partition_logged_missing(fedoras_config, caplog):
    grid = InProcessGrid(client_app, fedoras_config, NUM_NODES)
    strategy = fedoras(fedoras_config)
    strategy.setup(grid)
    gone = grid.node_of_partition[2]
    grid.remove_node(gone)
    with caplog.at_level(logging.WARNING):
        sampled_partitions(strategy, grid, 1)
        sampled_partitions(strategy, grid, 2)
    line = f"node {gone} is gone: partition 2 has no node"
    assert caplog.text.count(line) == 1  # once, not every round


def test_a_newcomer_claiming_a_live_partition_is_refused_and_the_holder_kept(
    fedoras_config, caplog
):
    # A stranger under a fresh node id cannot remove an honest node by claiming its
    # partition (it could again and again, one node after another): the holder, which
    # answered first and is still connected, keeps it.
    grid = InProcessGrid(client_app, fedoras_config, NUM_NODES)
    strategy = fedoras(fedoras_config)
    strategy.setup(grid)
    reference = [sampled_partitions(strategy, grid, r) for r in (1, 2, 3)]
    holder = grid.node_of_partition[4]
    twin = grid.add_node(4)
    with caplog.at_level(logging.WARNING):
        again = [sampled_partitions(strategy, grid, r) for r in (1, 2, 3)]
    assert holder in strategy.profiles and twin not in strategy.profiles
    assert again == reference
    assert (
        f"dropped reply of node {twin}: partition id 4 is held by node {holder}, still "
        "connected: the newcomer is refused" in caplog.text
    )


def test_a_newcomer_with_a_bad_profile_is_dropped_and_the_run_goes_on(fedoras_config, caplog):
    grid = InProcessGrid(client_app, fedoras_config, NUM_NODES)
    strategy = fedoras(fedoras_config)
    strategy.setup(grid)
    grid.remove_node(grid.node_of_partition[5])
    liar = grid.add_node(5, fault=profile_fault("inflated-train"))
    with caplog.at_level(logging.WARNING):
        sampled = sampled_partitions(strategy, grid, 1)
        sampled_partitions(strategy, grid, 2)
    assert liar not in strategy.profiles and sampled
    assert caplog.text.count(f"node {liar}: profile refused") == 1  # asked once
    assert strategy.ledger.stage_totals("profile").rejected == 1


def test_fedoras_refuses_a_newcomer_whose_partition_has_no_tier(fedoras_config, caplog):
    grid = InProcessGrid(client_app, fedoras_config, NUM_NODES)
    strategy = fedoras(fedoras_config)
    strategy.setup(grid)
    stranger = grid.add_node(NUM_NODES - 1, {"partition-id": 0, "num-partitions": NUM_NODES})
    grid.contexts[stranger].node_config["partition-id"] = NUM_NODES - 1
    del grid.contexts[grid.node_of_partition[NUM_NODES - 1]]
    del strategy.tier_of_partition[NUM_NODES - 1]  # as if it had no node at the start
    with caplog.at_level(logging.WARNING):
        sampled_partitions(strategy, grid, 1)
    assert stranger not in strategy.profiles
    assert f"cannot join mid-run: partition {NUM_NODES - 1} was given no tier" in caplog.text


def test_decnas_regroups_with_a_node_that_appeared_mid_run(data_cache, caplog):
    config = tiny_decnas(data_cache)
    grid = InProcessGrid(client_app, config, NUM_NODES)
    strategy = decnas(config)
    strategy.profile_nodes(grid, ConfigRecord({"method": "decnas"}))
    first = strategy.regroup(grid, 1)["groups"]
    grid.remove_node(grid.node_of_partition[1])
    new = grid.add_node(1)
    with caplog.at_level(logging.INFO):
        second = strategy.regroup(grid, 2)["groups"]
    assert sorted(sum(second, [])) == sorted(sum(first, [])) == list(range(NUM_NODES))
    assert new in {p.node_id for group in strategy.groups for p in group}


def test_a_dpfnas_party_that_reconnects_keeps_its_place_and_a_stranger_cannot_join(
    data_cache, caplog
):
    config = tiny_dpfnas(data_cache, **{"dpfnas.iterations": 1, "dpfnas.final-rounds": 0})
    settings = parse_run_config(config)
    grid = InProcessGrid(client_app, config, 4)
    strategy = DPFNAS(space=build_supernet(settings), settings=settings.method_settings, seed=0)
    grid.remove_node(grid.node_of_partition[3])  # partition 3 has no node at the start
    strategy.setup(grid)
    assert [p.partition_id for p in strategy.parties] == [0, 1, 2]
    old = grid.node_of_partition[1]
    grid.remove_node(old)
    new = grid.add_node(1)
    stranger = grid.add_node(3)
    arrays = ArrayRecord(strategy.space.state_dict())
    with caplog.at_level(logging.INFO):
        messages = strategy.configure_train(1, arrays, ConfigRecord({"phase": "weights"}), grid)
    assert sorted(m.metadata.dst_node_id for m in messages) == sorted(
        [grid.node_of_partition[0], new, grid.node_of_partition[2]]
    )
    assert [p.node_id for p in strategy.parties] == [
        grid.node_of_partition[0],
        new,
        grid.node_of_partition[2],
    ]
    assert strategy.steps[1]["weights"] == 1  # the partition's privacy account goes on
    assert (
        f"node {stranger}: cannot join mid-run: partition 3 is not one of the run's parties"
        in caplog.text
    )


def test_fdnas_samples_a_node_that_joins_a_partition_without_a_node(data_cache, caplog):
    from tests.runconfig import tiny_fdnas
    from tests.strategies.test_fdnas import make_strategy

    config = tiny_fdnas(data_cache, **{"fdnas.clients-per-round": NUM_NODES})
    grid = InProcessGrid(client_app, config, NUM_NODES)
    grid.remove_node(grid.node_of_partition[5])  # partition 5 has no node at the start
    strategy = make_strategy(config)
    strategy.setup(grid)
    assert 5 not in strategy.cluster_of_partition
    new = grid.add_node(5)
    arrays = ArrayRecord(strategy.space.state_dict())
    with caplog.at_level(logging.INFO):
        messages = strategy.configure_train(1, arrays, ConfigRecord(), grid)
    assert new in {m.metadata.dst_node_id for m in messages}
    assert 5 in strategy.cluster_of_partition
    assert f"node {new} joined with partition 5" in caplog.text
