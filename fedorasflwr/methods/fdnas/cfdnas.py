"""CFDNAS (Zhang et al., arXiv:2011.03372, Algorithm 2): FDNAS, then one search per cluster.

Clients are grouped by a tag (``node_config`` ``cluster``, or derived
reproducibly from the partition); each cluster inherits w and alpha from the
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

    def run(self, grid: Grid, initial_arrays: ArrayRecord) -> FDNASResult:
        """FDNAS search (and net), then search, derive and train per cluster.

        Flower's parameters as ``FDNAS.start``: ``num_rounds`` is the number of global
        search rounds (naive-CFDNAS without ``train_global`` runs none); each cluster
        searches ``settings.cluster_rounds`` rounds; ``evaluate_fn`` sees the global
        supernet. The constructor's ``resume`` continues the global search after its
        last round, or skips a finished one (the clusters' searches and nets start
        again)."""
        log(INFO, "CFDNAS: %s", "inherited" if self.inherit else "naive")
        arrays = self.begin_search(grid, initial_arrays)
        resume = self.resume
        s = self.settings
        clusters = sorted(set(self.cluster_of_partition.values()))
        latency = s.resource == "latency"
        targets = s.cluster_target_ms if latency else s.cluster_target_flops
        key = s.cluster_targets_key()
        if not targets or (len(targets) > 1 and len(targets) != len(clusters)):
            raise ValueError(
                f"run config {key!r} has {len(targets)} "
                f"values for {len(clusters)} clusters {clusters}: give one, or one per cluster"
            )
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
            nets.append(self.with_latency(net, stage.table, stage.target))
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
            nets.append(self.with_latency(net, tables[tag], target))
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
