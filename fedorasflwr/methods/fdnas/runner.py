"""FDNAS's and CFDNAS's runner: run config -> mbconv space, the strategy, nets, plots, ONNX."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from logging import WARNING
from pathlib import Path
from typing import Any

from flwr.serverapp import Grid
from flwr.supercore import log

from ... import runs
from ...arrays import record_of
from ...checkpoints import Checkpointer
from ...config import RunSettings, space_kwargs
from ...costs import COST_CONVENTION
from ...data import dataset_info
from ...federation.base import NodeProfile
from ...latency import table_document
from ...model_files import SPACE, SUBNET
from ...progress import PlannedStage, RunEstimate
from ...search_spaces import build_space
from ...seeding import seed_torch
from .cfdnas import CFDNAS
from .clusters import cluster_ranges, contiguous_cluster
from .plots import plot_alpha_entropy, plot_fdnas_nets, plot_fdnas_ops
from .strategy import FDNAS

__all__ = [
    "cluster_tagger",
    "fdnas_plan",
    "fdnas_plots",
    "planned_clusters",
    "run_cfdnas",
    "run_fdnas",
]


#: how ``result.json``'s per-net accuracies are averaged
ACCURACY_CONVENTION = (
    "averaged-accuracy: the test accuracy on the pooled test samples of the net's partitions "
    "(test-accuracy per partition weighted by its test-count); mean-local-accuracy: the "
    "unweighted mean over clients of local-accuracy"
)


def cluster_tagger(settings: RunSettings) -> Callable[[NodeProfile], int] | None:
    """The CFDNAS tag of a node that declares no ``cluster``.

    With the class-groups partitioner: the node's class group (the paper's data tag), the
    class groups' contiguous ranges of partition ids (``clusters.contiguous_cluster``);
    ``fdnas.num-clusters`` is then not used (a WARNING when it differs).  Otherwise
    ``None``: the strategy's own rule, ``fdnas.num-clusters`` contiguous ranges.
    """
    spec = settings.data
    if spec.partitioner != "class-groups":
        return None
    groups = len(spec.class_group_layout())
    if settings.method == "cfdnas" and settings.method_settings.num_clusters != groups:
        log(
            WARNING,
            "run config 'fdnas.num-clusters' = %d is not used: with 'data.partitioner' = "
            "'class-groups' the clusters are the %d class groups",
            settings.method_settings.num_clusters,
            groups,
        )
    return ClassGroupTag(groups)


@dataclass(frozen=True)
class ClassGroupTag:
    """A node's class group under the class-groups partitioner: ``groups`` contiguous
    ranges of partition ids (fewer with fewer partitions), as the partitioner deals them."""

    groups: int

    @property
    def rule(self) -> str:
        """How the clusters were formed, for the strategy's logs and errors."""
        return f"the {self.groups} class groups of 'data.partitioner' = 'class-groups'"

    def __call__(self, profile: NodeProfile) -> int:
        total = profile.num_partitions
        return contiguous_cluster(profile.partition_id, total, min(self.groups, total))


def _run_fdnas(
    strategy_class: type[FDNAS],
    grid: Grid,
    settings: RunSettings,
    out_dir: Path,
    progress: Checkpointer | None = None,
) -> dict[str, Any]:
    space_settings = replace(settings.space, name="mbconv")
    seed_torch(settings.seed, "init")
    space = build_space(**space_kwargs(space_settings, dataset_info(settings.data)))
    strategy = strategy_class(
        space=space,
        settings=settings.method_settings,
        cluster_of=cluster_tagger(settings),
        latency_request=settings.latency.request(settings.seed),
        **runs.strategy_options(
            settings,
            runs.resume_checkpoint(
                settings, space, {"search": settings.method_settings.train.rounds}
            ),
        ),
    )
    run = runs.RunFiles(out_dir, settings, space.spec, progress)
    initial = record_of(space.state_dict())
    clusters = planned_clusters(settings) if strategy_class is CFDNAS else 0
    with fdnas_plan(settings.method_settings, settings.min_nodes, clusters).active():
        result = runs.start(
            strategy, grid, settings, run, initial, settings.method_settings.train.rounds
        )
    run.save("supernet", result.supernet, stage="search", builder=SPACE)
    for net in result.nets:  # scored on the server as written (runs.RunFiles.save_final)
        final = run.save_final(
            net.name,
            space.subnet(net.arch),
            net.arrays,
            stage="final",
            builder=SUBNET,
            arch=list(net.arch),
        )
        if final.score is not None:
            net.global_test_accuracy, net.global_test_count = (
                final.score.accuracy,
                final.score.count,
            )
    document = {
        "space": runs.describe_space(space),
        "flops-convention": COST_CONVENTION,
        "accuracy-convention": ACCURACY_CONVENTION,
        "cluster-of-partition": result.cluster_of_partition,
        "nets": [net.summary() for net in result.nets],
        "search-history": result.search_history,
        "cluster-history": result.cluster_history,
        "ledger": result.ledger,
    }
    if settings.method_settings.resource == "latency":
        document["latency-tables"] = {
            **runs.latency_document(strategy.profiles, result.latency_tables),
            "groups": {name: table_document(t) for name, t in result.group_tables.items()},
        }
    run.add(
        *fdnas_plots(out_dir, document, strategy_class.__name__, runs.chance_accuracy(settings))
    )
    return {**document, **run.document()}


def planned_clusters(settings: RunSettings) -> int:
    """CFDNAS's clusters as planned from the run config: the class groups with the
    class-groups partitioner (``cluster_tagger``), else ``fdnas.num-clusters`` (nodes that
    declare a ``cluster`` are not foreseen)."""
    if settings.data.partitioner == "class-groups":
        return len(settings.data.class_group_layout())
    return settings.method_settings.num_clusters


def fdnas_plan(settings: Any, nodes: int, clusters: int = 0) -> RunEstimate:
    """The whole run's estimate (``progress.RunEstimate``) of FDNAS (``clusters`` 0) or
    CFDNAS (``clusters`` > 0), in client-epochs (a round: its clients times local epochs),
    ``nodes`` partitions: the global search's rounds (``search``); the derived net's FedAvg
    on every node (``final-fdnas``); per cluster, its search rounds (``cluster-<k>``) and
    its net's FedAvg on the cluster's nodes (``final-cluster-<k>``), the clusters being
    ``clusters`` contiguous ranges of the ``nodes`` partitions (``clusters.cluster_ranges``;
    a range left empty is no cluster)."""
    train, final = settings.train, settings.final
    stages = [
        PlannedStage("search", train.rounds, float(train.clients(nodes) * train.local_epochs)),
        PlannedStage("final-fdnas", final.rounds, float(nodes * final.local_epochs)),
    ]
    sizes = [len(r) for r in cluster_ranges(nodes, clusters) if len(r)] if clusters else []
    if sizes:  # one pattern for every cluster: the work per step is their mean
        search = sum(train.clients(size) for size in sizes) * train.local_epochs / len(sizes)
        tuning = nodes * final.local_epochs / len(sizes)
        stages += [
            PlannedStage("cluster-*", len(sizes) * settings.cluster_rounds, search),
            PlannedStage("final-cluster-*", len(sizes) * final.rounds, tuning),
        ]
    return RunEstimate(stages, replan=lambda count: fdnas_plan(settings, count, clusters).stages)


def fdnas_plots(
    out_dir: Path, document: dict[str, Any], method: str, chance: float | None = None
) -> list[Path | None]:
    """The derived nets' accuracy against FLOPs (``chance``: its chance line), the alpha
    entropy per search round and the operation each net chose per layer."""
    return [
        plot_fdnas_nets(
            out_dir / "nets_accuracy_flops.png", document["nets"], method=method, chance=chance
        ),
        plot_alpha_entropy(
            out_dir / "alpha_entropy.png",
            document["search-history"],
            document["cluster-history"],
            options=[len(c["options"]) for c in document["space"]["choices"]],
            method=method,
        ),
        plot_fdnas_ops(out_dir / "nets_operations.png", document["nets"], method=method),
    ]


def run_fdnas(
    grid: Grid, settings: RunSettings, out_dir: Path, progress: Checkpointer | None = None
) -> dict[str, Any]:
    """FDNAS: federated search on the mbconv space, derive, FedAvg-train the net."""
    return _run_fdnas(FDNAS, grid, settings, out_dir, progress)


def run_cfdnas(
    grid: Grid, settings: RunSettings, out_dir: Path, progress: Checkpointer | None = None
) -> dict[str, Any]:
    """CFDNAS: FDNAS, then per-cluster search and one trained net per cluster."""
    return _run_fdnas(CFDNAS, grid, settings, out_dir, progress)
