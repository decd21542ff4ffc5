"""configs/quick-cfdnas.toml shows CFDNAS's point: the clients form clusters (the class
groups), each cluster's search moves its alphas and ends on a net cheaper than the global
(FDNAS) net, and each cluster's net, on its own clients, beats 5x chance; the summary
sets the FDNAS net on the same clients beside it (the comparison the preset promises)."""

from __future__ import annotations

import pytest

from fedorasflwr.methods.fdnas.summary import pooled_accuracy
from tests.presets.common import MIN_ACCURACY, entropy_ratio, run_preset

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def preset(tmp_path_factory, data_cache):
    return run_preset("quick-cfdnas", tmp_path_factory.mktemp("quick-cfdnas"), data_cache)


def nets(document):
    return {net["name"]: net for net in document["nets"]}


def test_at_least_two_clusters_each_with_its_net(preset) -> None:
    named = nets(preset.document)
    clusters = [name for name in named if name.startswith("cluster-")]
    assert len(clusters) >= 2
    assert len(set(preset.document["cluster_of_partition"].values())) == len(clusters)


def test_every_search_moves_its_alphas(preset) -> None:
    document = preset.document
    options = len(document["space"]["choices"][0]["options"])
    assert entropy_ratio(document["search_history"][-1]["alpha_entropy"], options) < 0.9
    for cluster, history in document["cluster_history"].items():
        assert entropy_ratio(history[-1]["alpha_entropy"], options) < 0.9, cluster


def test_cluster_nets_are_cheaper_and_reach_five_times_chance(preset) -> None:
    named = nets(preset.document)
    fdnas = named.pop("fdnas")
    assert fdnas["averaged_accuracy"] >= MIN_ACCURACY
    for name, net in named.items():
        assert net["flops"] < fdnas["flops"], name
        assert net["averaged_accuracy"] >= MIN_ACCURACY, (name, net["averaged_accuracy"])
        assert pooled_accuracy(fdnas, net["partitions"]) is not None


def test_the_summary_sets_the_fdnas_net_beside_each_cluster_net(preset) -> None:
    text = "\n".join(preset.summary)
    assert "fdnas net on these clients" in text
