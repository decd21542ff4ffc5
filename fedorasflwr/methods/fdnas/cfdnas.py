"""CFDNAS (Zhang et al., arXiv:2011.03372, Algorithm 2): FDNAS, then one search per cluster.

Clients are grouped by a tag: the ``cluster`` a node's config declares (the paper's
"users' tag"), else the strategy's ``cluster_of``, else ``fdnas.num-clusters`` contiguous
ranges of partition ids (``clusters.contiguous_cluster``); the clusters are checked and
logged right after profiling, before any training.  Each cluster inherits w and alpha from the
FDNAS supernet ("meta-test") and repeats the search inside the cluster with its
own FLOPs target (or, with ``fdnas.resource = "latency"``, its own latency target in ms
on its cluster's group table), giving one net per cluster trained on its cluster's clients.
*naive-CFDNAS* (``inherit=False``) starts each cluster from a fresh supernet.
The client contract is FDNAS's (see ``fedorasflwr.methods.fdnas.strategy``).
"""

from __future__ import annotations

from logging import INFO
from typing import Any

from flwr.app import ArrayRecord
from flwr.serverapp import Grid
from flwr.supercore import log

from ...federation.base import NodeProfile
from .clusters import cluster_ranges
from .strategy import FDNAS, DerivedNet, FDNASResult

__all__ = ["CFDNAS"]


class CFDNAS(FDNAS):
    """CFDNAS: FDNAS, then per-cluster search inheriting w and alpha, one net per cluster.

    Parameters
    ----------
    inherit : bool (default: True)
        ``False`` gives naive-CFDNAS: every cluster searches from a fresh supernet.
    train_global : bool (default: True)
        Also train and report the FDNAS (global) net.
    **kwargs
        See ``FDNAS``.
    """

    method = "cfdnas"

    def __init__(self, *, inherit: bool = True, train_global: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.inherit = inherit
        self.train_global = train_global

    def check_clusters(self) -> None:
        """Log the clusters, then refuse, naming the reason and the fix: with the default
        rule, fewer nodes than ``fdnas.num-clusters`` or a cluster without a node; with
        any rule, a number of cluster targets that is neither one nor one per cluster."""
        self.log_clusters()
        s = self.settings
        clusters = sorted(set(self.cluster_of_partition.values()))
        by_default = set(self.cluster_rule_of.values()) == {"contiguous"}
        if by_default:
            self._check_default_clusters(clusters)
        targets = s.cluster_target_ms if s.resource == "latency" else s.cluster_target_flops
        if not targets or (len(targets) > 1 and len(targets) != len(clusters)):
            fix = "give one value for every cluster, or one per cluster in tag order"
            if by_default and targets:
                fix += f", or set 'fdnas.num-clusters' = {len(targets)}"
            raise ValueError(
                f"run config {s.cluster_targets_key()!r} has {len(targets)} value(s) for "
                f"{len(clusters)} cluster(s) {clusters} (formed by {self.cluster_rules()}): "
                f"{fix}"
            )

    def _check_default_clusters(self, clusters: list[int]) -> None:
        """Every one of the ``fdnas.num-clusters`` contiguous ranges holds a node."""
        wanted = self.settings.num_clusters
        partitions = sorted(self.cluster_of_partition)
        if len(partitions) < wanted:
            raise ValueError(
                f"run config 'fdnas.num-clusters' = {wanted}: only {len(partitions)} node(s) "
                f"were profiled (partitions {partitions}) and every cluster needs one: set "
                f"'fdnas.num-clusters' to at most {len(partitions)}, start more nodes, or "
                "declare each node's cluster in its node config ('cluster=<tag>')"
            )
        total = max(p.num_partitions for p in self.profiles.values())
        for tag, members in enumerate(cluster_ranges(total, wanted)):
            if tag not in clusters:  # (unknown num-partitions: ranks, none empty here)
                raise ValueError(
                    f"run config 'fdnas.num-clusters' = {wanted}: cluster {tag} (partition ids "
                    f"{members.start}..{members.stop - 1} of num-partitions = {total}) has no "
                    f"node (profiled: partitions {partitions}): start a node for one of them, "
                    "lower 'fdnas.num-clusters', or declare each node's cluster in its node "
                    "config ('cluster=<tag>')"
                )

    def admit_late(self, profile: NodeProfile) -> str | None:
        """As ``FDNAS.admit_late``; a new partition's cluster is logged."""
        new = profile.partition_id not in self.cluster_of_partition
        refused = super().admit_late(profile)
        if new and refused is None:
            log(
                INFO,
                "CFDNAS: partition %d joins cluster %d (%s)",
                profile.partition_id,
                self.cluster_of_partition[profile.partition_id],
                self.cluster_rule_of[profile.partition_id],
            )
        return refused

    def run(self, grid: Grid, initial_arrays: ArrayRecord) -> FDNASResult:
        """FDNAS search (and net), then search, derive and train per cluster.

        Flower's parameters as ``FDNAS.start``: ``num_rounds`` is the number of global
        search rounds (naive-CFDNAS without ``train_global`` runs none); each cluster
        searches ``settings.cluster_rounds`` rounds; ``evaluate_fn`` sees the global
        supernet. The constructor's ``resume`` continues the global search after its
        last round, or skips a finished one (the clusters' searches and nets start
        again)."""
        log(INFO, "CFDNAS: %s", "inherited" if self.inherit else "naive")
        arrays = self.begin_search(grid, initial_arrays)  # profiles and checks the clusters
        resume = self.resume
        s = self.settings
        clusters = sorted(set(self.cluster_of_partition.values()))
        key = s.cluster_targets_key()
        members = {
            tag: sorted(p for p, t in self.cluster_of_partition.items() if t == tag)
            for tag in clusters
        }
        # resource latency: every cluster's group table and target, checked before training
        tables = {tag: self.stage_table(f"cluster-{tag}", members[tag]) for tag in clusters}
        for index, tag in enumerate(clusters):
            if tables[tag] is not None:
                self.check_target(key, s.cluster_target(index), tables[tag], f"cluster-{tag}")
        everyone = self.partitions()
        nets: list[DerivedNet] = []
        history: list[dict[str, Any]] = []
        supernet = arrays
        stage = self.whole_search()
        if self.inherit or self.train_global:
            if stage.table is not None:
                self.check_target("fdnas.target-ms", stage.target, stage.table, "search")
            supernet, history = self.global_search(grid, arrays, resume)
        if self.train_global:
            arch = self.derive(supernet, stage.table, stage.target)
            net = self.train_net(
                grid, name="fdnas", arch=arch, supernet=supernet, partitions=everyone
            )
            nets.append(self.with_target(net, stage.table, stage.target))
        cluster_history: dict[int, list[dict[str, Any]]] = {}
        for index, tag in enumerate(clusters):
            start_arrays = supernet if self.inherit else self.fresh_supernet("cluster", tag)
            target = s.cluster_target(index)
            cluster_arrays, cluster_history[tag] = self.search(
                grid,
                start_arrays,
                stage=f"cluster-{tag}",
                partitions=members[tag],
                rounds=s.cluster_rounds,  # naive-CFDNAS: equal rounds, fresh start
                target=target,
                # a fresh supernet warms up for the global search's share of its rounds;
                # an inherited one is warm
                warmup=0 if self.inherit else s.fresh_cluster_warmup(),
                table=tables[tag],
            )
            arch = self.derive(cluster_arrays, tables[tag], target)
            net = self.train_net(
                grid,
                name=f"cluster-{tag}",
                arch=arch,
                supernet=cluster_arrays,
                partitions=members[tag],
            )
            nets.append(self.with_target(net, tables[tag], target))
        result = FDNASResult(
            supernet=supernet,
            nets=nets,
            cluster_of_partition=dict(self.cluster_of_partition),
            search_history=history,
            cluster_history=cluster_history,
            ledger=self.ledger.summary(),
            latency_tables=dict(self.latency_tables),
            group_tables=dict(self.group_tables),
        )
        self.contract_result(result, supernet)
        return result
