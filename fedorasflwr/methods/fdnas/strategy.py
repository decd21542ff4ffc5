"""FDNAS (Zhang et al., "FDNAS: Improving Data Privacy and Model Diversity in AutoML",
arXiv:2011.03372): federated ProxylessNAS, shared by CFDNAS.

FDNAS (Algorithm 1): every round the sampled clients download the supernet
weights w and architecture parameters alpha, run E local epochs of
ProxylessNAS updates (w on the training split, alpha on the validation split
with a hardware-aware loss) and return both; the server averages both weighted
by local data size (FedAvg, Eq. 5).  The derived net (argmax alpha per layer, pulled toward
the stage's FLOPs target: ``derivation``) is then trained with FedAvg (``SeededFedAvg``), from
scratch or from the supernet's weights.

CFDNAS (Algorithm 2), the per-cluster refinement, is in
``fedorasflwr.methods.fdnas.cfdnas``; the derived nets and their FedAvg stage in
``fedorasflwr.methods.fdnas.nets``.

Client contract
---------------
``query.profile``
    config: ``method``.  Reply: ConfigRecord ``profile`` (see ``NodeProfile``).
``train.fdnas_search``
    arrays: the whole supernet ``state_dict`` (alphas included, keys ``*.alpha``).
    config: ``method``, ``phase`` (``"search"``), ``stage``, ``server-round``,
    ``seed``, ``local-epochs``, ``batch-size``, ``lr``, ``momentum``,
    ``weight-decay``, ``alpha-lr``, ``alpha-every``, ``target-flops`` (absolute
    FLOPs), ``hardware-loss``, ``hardware-beta``, ``hardware-lambda`` and
    ``space.<kwarg>``; with ``fdnas.resource = "latency"``, ``target-ms``,
    ``latency-option-ms`` and ``latency-fixed-ms`` (the stage's group table,
    ``hardware.py``) instead of ``target-flops``.  Reply: ArrayRecord ``arrays`` with
    every key sent; MetricRecord ``metrics`` with
    ``num-examples`` (local data size N_k), ``train-loss``, ``val-loss``,
    ``train-flops``, ``expected-flops`` (and ``expected-ms`` with the latency term).
``train.fdnas_final``
    arrays: the derived net's ``state_dict``.  config: ``method``, ``phase``
    (``"final"``), ``arch``, ``net-flops``, ``server-round``, ``seed``,
    ``local-epochs``, ``batch-size``, ``lr``, ``momentum``, ``weight-decay``,
    ``space.<kwarg>``.  Reply: the trained arrays; metrics ``num-examples``,
    ``train-loss``, ``train-flops``, ``local-accuracy`` (test accuracy after
    the local epochs).
``evaluate.fdnas_final``
    arrays and config as above.  Reply: metrics ``num-examples`` (test
    samples), ``correct``, ``loss``, ``accuracy``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from ...arrays import record_of, state_dict_of
from ...checkpoints import Resume
from ...costs import describe_flops, flops_to_macs
from ...federation.aggregation import Aggregation, opa
from ...federation.base import FederatedNASStrategy, NodeProfile, sample_nodes
from ...federation.replies import ArraySpec, array_specs, check_reply
from ...latency import LatencyRequest, LatencyTable, group_table
from ...progress import StageClock, fmt
from ...protocol import ARRAYS, CONFIG, METRICS, space_to_config
from ...search_spaces.base import SearchSpace
from ...search_spaces.differentiable import require_differentiable
from ...search_spaces.importable import require_importable
from ...seeding import seed_torch
from .clusters import bounded_cluster, contiguous_cluster, describe_clusters, rank_bounds
from .derivation import derive_toward
from .hardware import (
    SLACK,
    derive_within_ms,
    expected_latency,
    latency_config,
    path_range_ms,
)
from .messages import FDNAS_EVALUATE, FDNAS_SEARCH, FDNAS_TRAIN
from .nets import DerivedNet, FDNASResult, LocalAccuracyFedAvg
from .settings import FDNASSettings

__all__ = ["FDNAS", "DerivedNet", "FDNASResult", "SearchStage"]

SEARCH_COUNTS = ("num-examples", "train-flops")
SEARCH = "search"


@dataclass(frozen=True)
class SearchStage:
    """One FDNAS search, passed to ``configure_train`` / ``aggregate_train``: its ledger
    ``name`` ("search" or "cluster-<k>"), the ``nodes`` it samples from, its ``rounds``
    (the cosine lr's length), its FLOPs ``target`` (a fraction of the largest path) and
    its first ``warmup`` rounds (weights only, alphas frozen).  With a latency ``table``
    (``fdnas.resource = "latency"``: the group table of its nodes) ``target`` is in
    milliseconds on that table."""

    name: str
    nodes: list[NodeProfile]
    rounds: int
    target: float
    warmup: int = 0
    table: LatencyTable | None = None

    def warming_up(self, server_round: int) -> bool:
        """Whether ``server_round`` is a warm-up round (``fdnas.warmup-rounds``)."""
        return server_round <= self.warmup


class FDNAS(FederatedNASStrategy[FDNASResult]):
    """FDNAS: federated ProxylessNAS search, derivation toward the target, FedAvg training.

    Parameters
    ----------
    space : SearchSpace
        The supernet, with architecture parameters per searchable layer: any
        ``DifferentiableSpace`` (``mbconv`` is the built-in) or a space with the methods of
        ``search_spaces.differentiable.DIFFERENTIABLE_API`` (else ``ValueError`` naming
        what is missing); its current weights and alphas are the initial global model.
    settings : FDNASSettings
        Hyper-parameters (paper values in its docstring).
    seed : int
        Fixes client sampling, client-side sampling and fresh supernets.
    cluster_of : callable, optional
        ``NodeProfile -> int``: the cluster tag of a node that declares no ``cluster`` in
        its node config (CFDNAS).  ``None`` (default): ``settings.num_clusters``
        contiguous ranges of partition ids (``clusters.contiguous_cluster``).  A
        ``rule`` attribute on it (a string) names it in logs and errors.
    validate_profiles : callable, optional
        Called with the node profiles before any training; raise to stop.
    resume : Resume, optional
        A checkpoint: the search continues after its last round (a finished search
        is skipped; the nets are trained again).
    min_nodes
        See ``FederatedNASStrategy``.
    latency_request : LatencyRequest, optional
        How the nodes measure their latency tables (``settings.resource = "latency"``).

    The final training (and CFDNAS's cluster searches) take their parameters from
    ``settings`` (``final_rounds``, ``cluster_rounds``, ...).
    """

    method = "fdnas"
    rounds_setting = "train.rounds"

    def __init__(
        self,
        *,
        space: SearchSpace,
        settings: FDNASSettings,
        seed: int,
        cluster_of: Callable[[NodeProfile], int] | None = None,
        validate_profiles: Callable[[Sequence[NodeProfile]], None] | None = None,
        resume: Resume | None = None,
        min_nodes: int = 2,
        latency_request: LatencyRequest | None = None,
    ) -> None:
        require_differentiable(space, type(self).__name__)
        require_importable(space, type(self).__name__)
        super().__init__(seed=seed, min_replies=settings.min_replies, min_nodes=min_nodes)
        self.resume = resume
        self.max_flops = settings.max_flops * space.max_flops()  # absolute bound
        if self.max_flops < space.min_flops():
            raise ValueError(
                f"run config 'fdnas.max-flops' = {settings.max_flops}: no net of the space fits"
                f" ({self.max_flops:.6g} FLOPs); allowed: at least"
                f" {space.min_flops() / space.max_flops():.4f} (the cheapest path's share)"
            )
        self.space = space
        self.settings = settings
        # how every aggregation combines a key's updates (settings.aggregation_rule)
        self.aggregation = Aggregation.of(settings)
        self.cluster_of = cluster_of
        self.validate_profiles = validate_profiles
        self.cluster_of_partition: dict[int, int] = {}
        self.cluster_rule_of: dict[int, str] = {}  # partition -> declared/cluster_of/contiguous
        self._rank_bounds: list[float] = []  # num-partitions unknown: where clusters start
        self._current = ArrayRecord()
        self._specs: dict[str, ArraySpec] = {}
        self._sent: set[int] = set()
        self._evaluating: tuple[str, dict[int, int]] = ("evaluate", {})  # stage, node -> pid
        self.evaluated: tuple[dict[int, float], dict[int, int]] = ({}, {})
        self.latency_request = latency_request
        self.group_tables: dict[str, LatencyTable] = {}  # stage -> its group's table

    def summary(self) -> None:
        s = self.settings
        log(
            INFO,
            "\t├── %s: %d search rounds, %d clients/round, %d local epoch(s), target %s",
            type(self).__name__,
            s.train.rounds,
            s.train.clients_per_round,
            s.train.local_epochs,
            f"{s.target_ms:g} ms" if s.resource == "latency" else f"{s.target_flops:.2f}",
        )
        log(
            INFO,
            "\t└── supernet %d elements, %d searchable layers, %s..%s",
            self.space.total_size,
            len(self.space.choices),
            describe_flops(self.space.min_flops()),
            describe_flops(self.space.max_flops()),
        )

    # --- setup -------------------------------------------------------------------

    def setup(self, grid: Grid) -> None:
        """Profile the nodes, tag each with its cluster and check the clusters."""
        profiles = self.profile_nodes(grid, ConfigRecord({"method": self.method}))
        ids = [p.partition_id for p in profiles.values()]
        self._rank_bounds = rank_bounds(ids, self.settings.num_clusters)
        for profile in profiles.values():
            self.cluster_of_partition[profile.partition_id] = self._cluster_tag(profile)
        self.check_clusters()
        if self.settings.resource == "latency":
            self.query_latency(grid, self.space, request=self.latency_request)

    def admit_late(self, profile: NodeProfile) -> str | None:
        """A node profiled mid-run joins with its partition's cluster (a new partition: the
        cluster it declares or ``cluster_of`` gives, as at the start)."""
        if profile.partition_id not in self.cluster_of_partition:  # no holder to refuse it
            self.cluster_of_partition[profile.partition_id] = self._cluster_tag(profile)
        return None

    def _cluster_tag(self, profile: NodeProfile) -> int:
        """The cluster a node declares, else ``cluster_of``'s, else its partition's among
        ``settings.num_clusters`` contiguous ranges (``clusters.contiguous_cluster``; of the
        ids profiled at the start when ``num-partitions`` is unknown); the rule that gave it
        is kept in ``cluster_rule_of[partition id]``."""
        rule, tag = self._tagged(profile)
        self.cluster_rule_of[profile.partition_id] = rule
        return tag

    def _tagged(self, profile: NodeProfile) -> tuple[str, int]:
        if profile.cluster >= 0:
            return "declared", profile.cluster
        if self.cluster_of is not None:
            return "cluster_of", int(self.cluster_of(profile))
        if profile.num_partitions < 1:  # unknown: ranges of the ids profiled at the start
            return "contiguous", bounded_cluster(profile.partition_id, self._rank_bounds)
        num_clusters = self.settings.num_clusters
        return "contiguous", contiguous_cluster(
            profile.partition_id, profile.num_partitions, num_clusters
        )

    def cluster_rules(self) -> str:
        """How the clusters were formed, for logs and errors."""
        rules = set(self.cluster_rule_of.values())
        words = []
        if "declared" in rules:
            declared = sorted(p for p, r in self.cluster_rule_of.items() if r == "declared")
            words.append(f"declared in the node config 'cluster' of partition(s) {declared}")
        if "cluster_of" in rules:
            words.append(getattr(self.cluster_of, "rule", "the strategy's cluster_of"))
        if "contiguous" in rules:
            words.append(
                f"'fdnas.num-clusters' = {self.settings.num_clusters} contiguous ranges of "
                "partition ids"
            )
        return " and ".join(words)

    def check_clusters(self) -> None:
        """Refuse clusters the method cannot search (before any training); FDNAS has
        none to check."""

    def log_clusters(self) -> None:
        """Log which partitions went to which cluster, and by what rule."""
        log(
            INFO,
            "%s clusters (%s): %s",
            type(self).__name__,
            self.cluster_rules(),
            describe_clusters(self.cluster_of_partition),
        )

    def stage_table(self, stage: str, partitions: Iterable[int]) -> LatencyTable | None:
        """The latency table standing for ``partitions``' nodes (``latency.group_table``:
        the per-entry median of their tables), kept in ``group_tables[stage]``; a node
        whose table was dropped is left out; a group without any table gets every node's
        group table, with a WARNING.  ``None`` with ``fdnas.resource = "flops"``."""
        if self.settings.resource != "latency":
            return None
        nodes = self.nodes_of(partitions)
        spec = self.space.spec
        tables = [t for p in nodes if (t := self._table_of(p.node_id, spec)) is not None]
        if len(tables) < len(nodes):
            missing = sorted(
                p.partition_id for p in nodes if self._table_of(p.node_id, spec) is None
            )
            log(INFO, "[%s] latency: no table from partition(s) %s, left out", stage, missing)
        if not tables:
            tables = [
                t for n in sorted(self.profiles) if (t := self._table_of(n, spec)) is not None
            ]
            log(WARNING, "[%s] no node has a latency table: the all-nodes table stands in", stage)
        self.group_tables[stage] = group_table(tables)
        return self.group_tables[stage]

    def check_target(self, key: str, target_ms: float, table: LatencyTable, stage: str) -> None:
        """Refuse a latency target no path of the space meets on ``table`` (before any
        training), naming the run-config ``key``."""
        low, high = path_range_ms(table)
        if target_ms * (1 + SLACK) < low:
            raise ValueError(
                f"run config {key!r} = {target_ms}: no net of the space fits in it on the "
                f"latency table of stage {stage!r} (paths take {low:.4g}..{high:.4g} ms); "
                f"allowed: at least {low:.4g}"
            )
        log(INFO, "[%s] latency target %.4g ms; paths %.4g..%.4g ms", stage, target_ms, low, high)

    def nodes_of(self, partitions: Iterable[int]) -> list[NodeProfile]:
        wanted = set(partitions)
        return [p for p in self.profiles.values() if p.partition_id in wanted]

    # --- one search round ---------------------------------------------------------

    def whole_search(self) -> SearchStage:
        """The global search: every profiled node, ``fdnas.rounds``, ``fdnas.target-flops``
        (``fdnas.target-ms`` on every node's group table with the resource latency)."""
        s = self.settings
        table = self.group_tables.get(SEARCH) or self.stage_table(SEARCH, self.partitions())
        target = s.target_flops if table is None else s.target_ms
        return SearchStage(
            SEARCH, list(self.profiles.values()), s.train.rounds, target, s.warmup_rounds, table
        )

    def partitions(self) -> list[int]:
        """Every profiled node's partition id."""
        return sorted(self.cluster_of_partition)

    def configure_train(
        self,
        server_round: int,
        arrays: ArrayRecord,
        config: ConfigRecord,
        grid: Grid,
        *,
        stage: SearchStage | None = None,
    ) -> Iterable[Message]:
        """Sample ``stage``'s clients (default: the global search over every node); send
        each the whole supernet (w and alpha)."""
        connected = self.connected_profiles(grid)  # nodes profiled mid-run join here
        stage = self.whole_search() if stage is None else stage
        s = self.settings
        wanted = {p.partition_id for p in stage.nodes}
        candidates = [p for p in connected if p.partition_id in wanted]
        chosen = sample_nodes(
            self.rng(stage.name, "sample", server_round), candidates, s.train.clients_per_round
        )
        self._current = arrays
        self._specs = array_specs(arrays)
        self._sent = {p.node_id for p in chosen}
        lr = 0.5 * s.train.lr * (1 + math.cos(math.pi * (server_round - 1) / max(stage.rounds, 1)))
        message_config = {
            **dict(config),
            "method": self.method,
            "phase": "search",
            "stage": stage.name,
            "server-round": server_round,
            "seed": self.seed,
            **s.train.client_config(lr=lr),
            "alpha-lr": s.alpha_lr,
            "alpha-every": 0 if stage.warming_up(server_round) else s.alpha_every,
            **(
                {"target-flops": stage.target * self.space.max_flops()}
                if stage.table is None
                else latency_config(stage.table, stage.target)
            ),
            "hardware-loss": s.hardware_loss,
            "hardware-beta": s.hardware_beta,
            "hardware-lambda": s.hardware_lambda,
            **space_to_config(self.space.spec),
        }
        messages = [
            Message(
                content=RecordDict({ARRAYS: arrays, CONFIG: ConfigRecord(message_config)}),
                message_type=FDNAS_SEARCH,
                dst_node_id=p.node_id,
            )
            for p in chosen
        ]
        return self.instruct("train", stage.name, server_round, messages)

    def check_train_reply(self, reply: Message) -> str | None:
        """Why a search reply is unusable, or ``None``."""
        if reply.metadata.src_node_id not in self._sent:
            return "reply from a node that was not asked"
        claim = self.claim(reply.metadata.src_node_id, "train", "val")
        reason = check_reply(
            reply, sent=self._specs, counts=SEARCH_COUNTS, bounds={"num-examples": claim}
        )
        if reason is not None:
            return reason
        if int(reply.content.metric_records[METRICS]["num-examples"]) < 1:
            return "num-examples is 0"
        if set(reply.content.array_records[ARRAYS].keys()) != set(self._specs):
            return "the reply does not carry every supernet key (w and alpha)"
        return None

    def aggregate_train(
        self,
        server_round: int,
        replies: Iterable[Message],
        *,
        stage: SearchStage | None = None,
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """w and alpha <- sum_k N_k / N (w_k, alpha_k) over the accepted replies (Eq. 5)
        of ``stage`` (default: the global search)."""
        stage = self.whole_search() if stage is None else stage
        screened = self.screened(stage.name, "train", replies)
        accepted = self.accept(stage.name, screened, self.check_train_reply)
        # a cluster smaller than min-replies needs all of its clients, not more
        if len(accepted) < min(self.min_replies, len(stage.nodes)):
            self.require(stage.name, len(accepted), len(self._sent))
        updates, totals, examples = [], {"train-loss": 0.0, "val-loss": 0.0}, 0
        for reply in accepted:
            metrics = reply.content.metric_records[METRICS]
            n = int(metrics["num-examples"])
            updates.append((reply.content.array_records[ARRAYS], n))
            node = self.ledger.node(stage.name, reply.metadata.src_node_id)
            node.train_flops += int(metrics["train-flops"])
            for key in totals:
                totals[key] += float(metrics[key]) * n
            examples += n
        arrays = opa(self._current, updates, min_contributors=1, aggregation=self.aggregation)
        if stage.warming_up(server_round):  # the alphas stay as sent, whatever came back
            for key in self.space.alpha_keys():
                arrays[key] = self._current[key]
        return arrays, MetricRecord(
            {
                **{key: value / examples for key, value in totals.items()},
                "num-examples": examples,
                "clients": len(accepted),
            }
        )

    # --- stages ---------------------------------------------------------------------

    def search(
        self,
        grid: Grid,
        arrays: ArrayRecord,
        *,
        stage: str,
        partitions: Iterable[int],
        rounds: int,
        target: float,
        warmup: int = 0,
        resume: Resume | None = None,
        table: LatencyTable | None = None,
    ) -> tuple[ArrayRecord, list[dict[str, Any]]]:
        """``rounds`` FDNAS rounds over ``partitions`` (with ``resume``, those after its
        last), the first ``warmup`` of them weights only; returns the supernet and
        history.  With a latency ``table``, ``target`` is in ms on it.  Only the global
        search (stage "search") is checkpointed; a cluster's search is short and starts
        again."""
        search = SearchStage(stage, self.nodes_of(partitions), rounds, target, warmup, table)
        history: list[dict[str, Any]] = []
        first = 1
        if resume is not None and resume.within(stage):
            arrays, first = resume.arrays, resume.step + 1
            history = [dict(h) for h in resume.history]
            log(INFO, "[%s] resumed after round %d (%s)", stage, resume.step, resume.path)
        if stage == SEARCH and first == 1:
            self._record_round(0, arrays, None)  # as Flower's start: before the first round
        self.reached(stage, first - 1)
        clock = StageClock(stage, rounds, first)
        for server_round in range(first, rounds + 1):
            started = time.perf_counter()
            messages = list(
                self.configure_train(server_round, arrays, ConfigRecord(), grid, stage=search)
            )
            replies = self.exchange(grid, stage, messages)
            new_arrays, metrics = self.aggregate_train(server_round, replies, stage=search)
            arrays = new_arrays if new_arrays is not None else arrays
            if stage == SEARCH:
                self._record_round(server_round, arrays, metrics)
            arch = self.derive(arrays, table, target)
            derived = self.space.cost(arch).flops
            expected = float(self.space.expected_flops().detach())
            entry = {
                "round": server_round,
                "sent": len(messages),
                **dict(metrics or {}),
                "derived": list(arch),
                "derived-flops": derived,
                "derived-macs": flops_to_macs(derived),
                "expected-flops": expected,
                "expected-macs": flops_to_macs(expected),
                **self._latency_entry(arch, table),
                "alpha-entropy": self.alpha_entropy(),
                "seconds": round(time.perf_counter() - started, 4),
            }
            log(
                INFO,
                "%s",
                clock.line(
                    server_round,
                    metrics,
                    **{
                        "derived-MFLOPs": entry["derived-flops"] / 1e6,
                        "derived-MMACs": entry["derived-macs"] / 1e6,
                    },
                    **{k: entry[k] for k in ("derived-ms", "expected-ms") if k in entry},
                ),
            )
            history.append(entry)
            self.reached(
                stage,
                server_round,
                arrays if stage == SEARCH else None,
                history=history,
                stage_done=server_round == rounds,
                **self._cluster_progress(),
            )
        return arrays, history

    def _latency_entry(self, arch: Sequence[int], table: LatencyTable | None) -> dict[str, float]:
        """The derived net's and the supernet's expected table latency (resource latency)."""
        if table is None:
            return {}
        expected = expected_latency(self.space, table.option_ms, table.fixed_ms)
        return {"derived-ms": table.path_ms(arch), "expected-ms": float(expected.detach())}

    def _record_round(
        self, server_round: int, arrays: ArrayRecord, metrics: MetricRecord | None
    ) -> None:
        """A global search round's training metrics; ``evaluate_fn`` on the supernet."""
        if metrics is not None:
            self.train_metrics[server_round] = metrics
        if self.evaluate_fn is not None:
            with self.ledger.timed("evaluate"):
                evaluated = self.evaluate_fn(server_round, arrays)
            if evaluated is not None:
                self.server_metrics[server_round] = evaluated

    def global_search(
        self, grid: Grid, arrays: ArrayRecord, resume: Resume | None
    ) -> tuple[ArrayRecord, list[dict[str, Any]]]:
        """The search on every client; resumed from ``resume`` if it stopped inside it,
        skipped (its supernet and history taken) if it had ended."""
        if resume is not None:
            saved = resume.progress.get("cluster-of-partition")
            if saved != self._cluster_progress()["cluster-of-partition"]:
                raise ValueError(
                    f"run config 'resume-from' = {resume.path!r}: its clusters {saved} differ "
                    f"from this run's {self._cluster_progress()['cluster-of-partition']}"
                )
            if not resume.within(SEARCH):
                log(INFO, "Search skipped: resuming from a searched supernet (%s)", resume.path)
                return resume.arrays, [dict(h) for h in resume.history]
        stage = self.whole_search()
        return self.search(
            grid,
            arrays,
            stage=SEARCH,
            partitions=self.partitions(),
            rounds=self.settings.train.rounds,
            target=stage.target,
            warmup=self.settings.warmup_rounds,
            resume=resume,
            table=stage.table,
        )

    def _cluster_progress(self) -> dict[str, Any]:
        return {"cluster-of-partition": {str(p): t for p, t in self.cluster_of_partition.items()}}

    def derive(
        self, arrays: ArrayRecord, table: LatencyTable | None = None, target: float | None = None
    ) -> tuple[int, ...]:
        """The derived net of the supernet ``arrays``.

        With a FLOPs ``target`` (a fraction of the largest path, as the stage's): the path
        of best log-probability less ``fdnas.derive-beta log(FLOPs / target)^2`` (with
        ``add-linear``: above the target only) within ``max-flops``
        (``derivation.derive_toward``); without one, argmax alpha per layer, or the most
        probable path within ``max-flops`` when the argmax exceeds it; with a latency
        ``table``, the most probable path within ``target`` ms on it."""
        self.space.load_state_dict(state_dict_of(arrays), strict=True)
        if table is not None:
            if target is None:
                raise ValueError("a derivation on a latency table needs its target in ms")
            return derive_within_ms(self.space, table, target)
        if target is None:
            return self.space.derive(self.max_flops)
        s = self.settings
        return derive_toward(
            self.space,
            target * self.space.max_flops(),
            s.derive_beta,
            self.max_flops,
            both_sides=s.hardware_loss == "log-gap",  # add-linear never asks for more FLOPs
        )

    def with_target(self, net: DerivedNet, table: LatencyTable | None, target: float) -> DerivedNet:
        """``net`` with its stage's target: in FLOPs (``target`` a fraction of the largest
        path), or with a latency ``table`` in ms, beside its predicted latency on it."""
        if table is not None:
            net.latency_ms, net.target_ms = table.path_ms(net.arch), target
        else:
            net.target_flops = target * self.space.max_flops()
        return net

    def alpha_entropy(self) -> list[float]:
        """Entropy (nats) of ``softmax(alpha)`` of each searchable layer of the loaded
        supernet, in layer order: ``ln(options)`` while undecided, 0 once one option wins."""
        return [
            round(float(-(p * torch.log(p.clamp_min(1e-12))).sum()), 6)
            for p in (q.detach() for q in self.space.probabilities())
        ]

    def fresh_supernet(self, *keys: int | str) -> ArrayRecord:
        """A newly initialised supernet (naive-CFDNAS), seeded from the run seed and ``keys``."""
        seed_torch(self.seed, "fresh", *keys)
        return record_of(self.space.fresh().state_dict())

    def train_net(
        self,
        grid: Grid,
        *,
        name: str,
        arch: tuple[int, ...],
        supernet: ArrayRecord,
        partitions: Sequence[int],
    ) -> DerivedNet:
        """FedAvg of the derived net over ``partitions``, then its test accuracy on each."""
        s = self.settings
        subnet = self._subnet(arch, supernet)
        nodes = self.nodes_of(partitions)
        stage = f"final-{name}"
        self.reached(stage, 0)
        fedavg = LocalAccuracyFedAvg(
            partition_of={p.node_id: p.partition_id for p in nodes},
            nodes=nodes,
            seed=self.seed,
            stage=stage,
            ledger=self.ledger,
            clients_per_round=len(nodes),
            min_replies=min(self.min_replies, len(nodes)),
            train_message_type=FDNAS_TRAIN,
            aggregation=self.aggregation,
            fraction_evaluate=0.0,
        )
        config = self._net_config(arch)
        config.update(
            {
                "phase": "final",
                **s.final.client_config(),
            }
        )
        arrays = record_of(subnet.state_dict())
        history: list[dict[str, Any]] = []
        if s.final.rounds:
            with self.ledger.timed(stage):
                result = fedavg.start(
                    grid,
                    arrays,
                    num_rounds=s.final.rounds,
                    timeout=self.reply_timeout,
                    train_config=self.with_user_config(FDNAS_TRAIN, config),
                )
            arrays = result.arrays
            history = [
                {"round": r, **dict(m)} for r, m in sorted(result.train_metrics_clientapp.items())
            ]
        self.reached(stage, s.final.rounds, stage_done=True)  # result.json's status
        accuracy, count = self.evaluate_net(grid, arch, arrays, nodes, stage)
        cost = self.space.cost(arch)
        net = DerivedNet(
            name=name,
            arch=arch,
            option_names=self.space.option_names(arch),
            flops=cost.flops,
            params=cost.params,
            arrays=arrays,
            partitions=sorted(accuracy),
            test_accuracy=accuracy,
            test_count=count,
            local_accuracy=dict(fedavg.local_accuracy),
            history=history,
        )
        local = net.mean_local_accuracy()
        log(
            INFO,
            "[%s] %s: averaged accuracy %s, mean local accuracy %s (%s)",
            stage,
            name,
            fmt(net.averaged_accuracy()),
            fmt(None if math.isnan(local) else local),
            describe_flops(net.flops),
        )
        return net

    def _subnet(self, arch: tuple[int, ...], supernet: ArrayRecord) -> torch.nn.Module:
        if self.settings.final_init == "supernet":
            self.space.load_state_dict(state_dict_of(supernet), strict=True)
            return self.space.subnet(arch)
        seed_torch(self.seed, "scratch", *arch)
        return self.space.fresh().subnet(arch)

    def _net_config(self, arch: Sequence[int]) -> dict[str, Any]:
        return {
            "method": self.method,
            "arch": [int(v) for v in arch],
            "net-flops": int(self.space.cost(arch).flops),
            "seed": self.seed,
            "server-round": 0,
            **space_to_config(self.space.spec),
        }

    def evaluate_net(
        self,
        grid: Grid,
        arch: tuple[int, ...],
        arrays: ArrayRecord,
        nodes: Sequence[NodeProfile],
        stage: str,
    ) -> tuple[dict[int, float], dict[int, int]]:
        """Test accuracy and test count of the net on each node's test split."""
        config = ConfigRecord({**self._net_config(arch), "phase": "evaluate"})
        self._evaluating = (stage + "-evaluate", {p.node_id: p.partition_id for p in nodes})
        messages = list(self.configure_evaluate(0, arrays, config, grid))
        replies = self.exchange(grid, stage + "-evaluate", messages)
        self.aggregate_evaluate(0, replies)
        return self.evaluated

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The derived net's ``arrays`` to each node being evaluated (``evaluate_net``);
        ``config`` carries its ``arch`` and ``space.<kwarg>``."""
        messages = [
            Message(
                content=RecordDict({ARRAYS: arrays, CONFIG: config}),
                message_type=FDNAS_EVALUATE,
                dst_node_id=node_id,
            )
            for node_id in self._evaluating[1]
        ]
        return self.instruct("evaluate", self._evaluating[0], server_round, messages)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Per partition test accuracy and count of the accepted replies (kept in
        ``evaluated``); returns the pooled accuracy. Error and malformed replies are
        skipped. ``None``: no usable reply."""
        stage, partition = self._evaluating
        accepted = self.accept(
            stage,
            self.screened(stage, "evaluate", replies),
            lambda r: check_reply(
                r,
                counts=("num-examples", "correct", "accuracy"),
                bounds=dict.fromkeys(
                    ("num-examples", "correct"), self.claim(r.metadata.src_node_id, "test")
                ),
            ),
        )
        accuracy, count = {}, {}
        for reply in accepted:
            metrics = reply.content.metric_records[METRICS]
            pid = partition[reply.metadata.src_node_id]
            accuracy[pid] = float(metrics["accuracy"])
            count[pid] = int(metrics["num-examples"])
        self.evaluated = (accuracy, count)
        if not accepted:
            return None
        total = sum(count.values())
        pooled = sum(accuracy[p] * count[p] for p in count) / max(total, 1)
        return MetricRecord({"accuracy": pooled, "num-examples": total, "clients": len(accepted)})

    # --- the whole method ---------------------------------------------------------------

    def run(self, grid: Grid, initial_arrays: ArrayRecord) -> FDNASResult:
        """Search on every client, derive, train the derived net with FedAvg, evaluate.

        Flower's parameters: ``initial_arrays`` initialise the supernet (w and alpha; an
        empty ``ArrayRecord``: the space's own); ``num_rounds`` is the number of search
        rounds (``settings.train.rounds`` is replaced by it); ``timeout`` the reply timeout;
        ``train_config`` / ``evaluate_config`` travel in every ``train.*`` /
        ``evaluate.*`` message; ``evaluate_fn(round, supernet)`` is called after every
        search round. The constructor's ``resume`` continues a checkpointed search."""
        arrays = self.begin_search(grid, initial_arrays)
        everyone = self.partitions()
        stage = self.whole_search()
        if stage.table is not None:
            self.check_target("fdnas.target-ms", stage.target, stage.table, SEARCH)
        supernet, history = self.global_search(grid, arrays, self.resume)
        arch = self.derive(supernet, stage.table, stage.target)
        net = self.train_net(grid, name="fdnas", arch=arch, supernet=supernet, partitions=everyone)
        result = FDNASResult(
            supernet=supernet,
            nets=[self.with_target(net, stage.table, stage.target)],
            cluster_of_partition=dict(self.cluster_of_partition),
            search_history=history,
            cluster_history={},
            ledger=self.ledger.summary(),
            latency_tables=dict(self.latency_tables),
            group_tables=dict(self.group_tables),
        )
        self.contract_result(result, supernet)
        return result

    def begin_search(self, grid: Grid, initial_arrays: ArrayRecord) -> ArrayRecord:
        """What FDNAS and CFDNAS do first: profile the nodes and tag their clusters;
        the initial supernet."""
        log(INFO, "Starting %s", type(self).__name__)
        self.summary()
        if self.resume is not None:
            self.ledger.restore(self.resume.ledger)
        with self.ledger.timed("setup"):
            self.setup(grid)
        return initial_arrays if len(initial_arrays) else record_of(self.space.state_dict())
