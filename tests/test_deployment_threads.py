"""Each SuperNode of a local deployment gets a torch thread count that fits the host."""

from __future__ import annotations

import os

import pytest

from fedorasflwr.launch import Deployment
from fedorasflwr.launch.deployment import threads_per_node


@pytest.mark.parametrize("supernodes", [1, 2, 3, 64])
def test_threads_per_node_never_oversubscribes(supernodes: int) -> None:
    threads = threads_per_node(supernodes)
    assert threads >= 1
    assert threads * supernodes <= max(os.cpu_count() or 1, supernodes)


def test_every_node_config_carries_num_threads_unless_given() -> None:
    deployment = Deployment(num_supernodes=3, node_configs=[{}, {"num-threads": 7}, {"tier": 1}])
    configs = [deployment._node_config(i) for i in range(3)]
    assert [c["num-threads"] for c in configs] == [threads_per_node(3), 7, threads_per_node(3)]
    assert [c["partition-id"] for c in configs] == [0, 1, 2]
    assert configs[2]["tier"] == 1
