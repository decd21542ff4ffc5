"""FedorAS (Dudziak et al., "FedorAS: Federated Architecture Search under
system heterogeneity", arXiv:2206.11239): the three stages in one ``start``.

Stage 1, federated supernet training (this module), Stage 2, NSGA-II search
per tier (``search``, ``scoring``), Stage 3, per-tier FedAvg
fine-tuning on the clients able to run the model (``finetune``).

Per round the server samples clients, draws for each a subspace of the
supernet that fits the communication budget B_comm (Eq. 1) and still holds a
path within the client's tier budget, and sends only the kept options'
weights plus the fixed parts.  Clients sample one path per batch under their
tier's FLOPs budget (Eq. 3), take one SGD step on it, and return the weights
of the options they touched with per-option sample counts.  The server
aggregates with OPA (Eq. 5).

Client contract
---------------
``query.profile``
    config: ``method``.  Reply: ConfigRecord ``profile`` (see ``NodeProfile``).
``train.fedoras_supernet``
    arrays: the subspace's ``state_dict`` entries.  config: ``method``,
    ``phase`` (``"supernet"``), ``server-round``, ``seed``, ``tier``,
    ``max-flops``, ``subspace-mask`` (flat 0/1 list, layer-major),
    ``local-epochs``, ``batch-size``, ``lr``, ``momentum``, ``weight-decay``
    and ``space.<kwarg>`` (the ``build_space`` arguments).
    Reply: ArrayRecord ``arrays`` with the fixed keys and the keys of every
    option with a positive count; MetricRecord ``metrics`` with
    ``num-examples``, ``train-loss``, ``train-flops`` and ``option-counts``
    (samples per option, layer-major, each layer summing to ``num-examples``).
    With ``return-all`` (``fedoras.aggregation = "fedavg"``, the comparison
    with plain FedAvg of supernets) the reply holds every key it received.

    With ``fedoras.resource = "latency"`` ``max-flops`` is the space's largest and
    the config adds ``resource`` ("latency"), ``max-latency-ms`` (the node's budget)
    and its own latency table, ``latency-option-ms`` (flat, layer-major) and
    ``latency-fixed-ms``.

Stages 2 and 3 are documented in ``scoring`` and ``finetune``.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from logging import DEBUG, INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result
from flwr.supercore import log
from torch.utils.data import TensorDataset

from ...arrays import record_of
from ...artifacts import plain
from ...checkpoints import Resume
from ...costs import describe_flops, flops_to_macs
from ...federation.aggregation import Aggregation, opa
from ...federation.base import FederatedNASStrategy, NodeProfile, sample_nodes
from ...federation.replies import ArraySpec, array_specs, check_reply
from ...latency import LatencyRequest, LatencyTable, group_table
from ...progress import StageClock
from ...protocol import ARRAYS, CONFIG, METRICS, space_to_config
from ...search_spaces import SearchSpace, Subspace, require_importable
from .context import StageContext
from .evaluation import ServerPathScorer, SupernetEvaluator
from .finetune import RANDOM_INIT, SUPERNET_INIT, TierModel, finetune_tier, random_search_tier
from .messages import FEDORAS_SUPERNET
from .scoring import (
    FederatedPathScorer,
    TierScorer,
    accepted_scores,
    path_messages,
    pooled_scores,
)
from .search import TierSearch, kendall_tau, search_tier
from .settings import STAGES, FedorASSettings
from .tiers import PathCost, Tier, assign_tiers, compute_tiers

__all__ = ["STAGES", "FedorAS", "FedorASResult", "default_evaluation"]

STAGE_SUPERNET = "supernet"
#: the stages ``start`` can stop after, in order
#: paths of a node's own table whose median latency orders nodes without a budget
SPEED_PATHS = 200


@dataclass(kw_only=True, repr=False)
class FedorASResult(Result):
    """What ``FedorAS.start`` returns: Flower's ``Result`` (``arrays``: the Stage-1
    supernet; per Stage-1 round the aggregated training metrics and ``evaluate_fn``'s),
    the tiers, and per tier the search's outcome and the fine-tuned models (``init``
    "supernet", and "random" for the rand-init comparison)."""

    tiers: list[Tier] = field(default_factory=list)
    tier_of_partition: dict[int, int] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    ledger: dict[str, Any] = field(default_factory=dict)
    searches: list[TierSearch] = field(default_factory=list)
    kendall_tau: dict[int, float | None] = field(default_factory=dict)
    models: list[TierModel] = field(default_factory=list)
    #: what the tiers bound (``fedoras.resource``); with "latency", the nodes' own
    #: tables (by node id) and each tier's table (the median of its nodes' tables)
    resource: str = "flops"
    latency_tables: dict[int, LatencyTable] = field(default_factory=dict)
    tier_tables: dict[int, LatencyTable] = field(default_factory=dict)

    def model(self, tier: int, init: str = SUPERNET_INIT) -> TierModel:
        """The fine-tuned model of ``tier`` (0-based) with the given initialisation."""
        return next(m for m in self.models if m.tier == tier and m.init == init)


@dataclass(frozen=True)
class _Sent:
    tier: int
    subspace: Subspace
    specs: dict[str, ArraySpec]


#: the numbers of a Stage-1 round's progress line
ROUND_KEYS = ("clients", "train-loss", "val-accuracy", "val-loss")


def default_evaluation(
    space: SearchSpace, settings: FedorASSettings, server_data: TensorDataset, seed: int
) -> SupernetEvaluator | None:
    """FedorAS's server-side validation of the Stage-1 supernet on ``server_data``: the
    accuracy of ``settings.eval_paths`` random paths (fixed by ``seed``), each
    BN-recalibrated; None when ``settings.eval_every`` is 0.  Scored on a copy of
    ``space`` (loaded with each round's weights; built without drawing from torch's RNG)."""
    if not settings.eval_every:
        return None
    return SupernetEvaluator(
        copy.deepcopy(space), server_data, num_paths=settings.eval_paths, seed=seed
    )


class FedorAS(FederatedNASStrategy[FedorASResult]):
    """FedorAS Stage 1: supernet training with tiers, subspaces and OPA.

    Parameters
    ----------
    space : SearchSpace
        The supernet; its current weights are the initial global model.
    settings : FedorASSettings
        Stage-1 hyper-parameters (paper values in the class docstring).
    seed : int
        Fixes tiers, client sampling, subspaces and client-side path sampling.
    evaluate_fn : callable, optional
        ``(round, arrays) -> MetricRecord``: server-side validation of the
        supernet, every ``eval_every`` rounds and after the last (``start``'s
        ``evaluate_fn``, when given, replaces it). Default: with ``server_data``
        (2 samples or more) and ``eval_every`` > 0, ``SupernetEvaluator`` on it (the
        mean, min and max accuracy of ``eval_paths`` random paths, each
        BN-recalibrated); else none.
    validate_profiles : callable, optional
        Called with the node profiles before any training; raise to stop
        (e.g. a data partition that cannot exist).
    server_data : TensorDataset, optional
        The server-held validation slice: validates the Stage-1 supernet (the
        default ``evaluate_fn``), scores paths in Stage 2 (required unless
        ``search-scoring`` is "federated") and draws the Stage-3 fine-tuning curves.
    resume : Resume, optional
        A checkpoint: Stage 1 continues at the round after its last, or, taken after
        Stage 1, the run starts again at the search (Stages 2-3 are not resumed
        mid-way: given the supernet they are deterministic and short).
    supernet_trained : bool (default: False)
        ``start``'s ``initial_arrays`` are a finished Stage 1: the run begins at the search.
    latency : LatencyRequest, optional
        How nodes time their latency tables when ``settings.resource`` is "latency"
        (run config ``latency.*``; default: ``LatencyRequest(seed=seed)``).
    min_nodes
        See ``FederatedNASStrategy``.

    The stages ``start`` runs end at ``settings.stop_after`` (run config
    ``fedoras.stop-after``); Stages 2 and 3 take their parameters from ``settings``.
    """

    def __init__(
        self,
        *,
        space: SearchSpace,
        settings: FedorASSettings,
        seed: int,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
        validate_profiles: Callable[[Sequence[NodeProfile]], None] | None = None,
        server_data: TensorDataset | None = None,
        resume: Resume | None = None,
        supernet_trained: bool = False,
        min_nodes: int = 2,
        latency: LatencyRequest | None = None,
    ) -> None:
        require_importable(space, "FedorAS")
        super().__init__(seed=seed, min_replies=settings.min_replies, min_nodes=min_nodes)
        if settings.stop_after not in STAGES:
            raise ValueError(
                f"settings.stop_after must be one of {STAGES}, got {settings.stop_after!r}"
            )
        self.resume = resume
        self.supernet_trained = supernet_trained
        self.space = space
        self.settings = settings
        # how every aggregation combines a key's updates (settings.aggregation_rule)
        self.aggregation = Aggregation.of(settings)
        self.evaluate_fn = evaluate_fn
        self.validate_profiles = validate_profiles
        self.comm_size = int(settings.comm_budget * space.total_size)
        smallest = space.fixed_size + sum(
            min(space.option_size(layer, o) for o in range(n))
            for layer, n in enumerate(space.num_options())
        )
        if self.comm_size < smallest:
            raise ValueError(
                f"run config 'fedoras.comm-budget' = {settings.comm_budget}: "
                f"{self.comm_size} elements cannot hold the smallest path "
                f"({smallest} of {space.total_size}); use at least "
                f"{smallest / space.total_size:.3f}"
            )
        self.server_data = server_data
        if evaluate_fn is None and server_data is not None and len(server_data) >= 2:
            self.evaluate_fn = default_evaluation(space, settings, server_data, seed)
        self.server_scorer: ServerPathScorer | None = None
        if settings.search_scoring in ("server", "both") and settings.stop_after != "supernet":
            if server_data is None or len(server_data) < 2:
                raise ValueError(
                    f"run config 'fedoras.search-scoring' = {settings.search_scoring!r} needs "
                    "a server-held validation slice of at least 2 samples: pass "
                    "FedorAS(server_data=...) (this project's app: 'data.server-fraction' > 0), "
                    'or set it to "federated"'
                )
            self.server_scorer = ServerPathScorer(
                space.fresh(),
                server_data,
                seed=seed,
                recalibrate=settings.search_recalibrate_bn,
            )
        self.tiers: list[Tier] = []
        self.tier_of_partition: dict[int, int] = {}
        self.latency_request = latency or LatencyRequest(seed=seed)
        # fedoras.resource = "latency": the used nodes' own tables, each tier's table, the
        # group table of every node (the tiers' bounds) and each node's Stage-1 budget (ms)
        self.node_tables: dict[int, LatencyTable] = {}
        self.tier_tables: dict[int, LatencyTable] = {}
        self.all_table: LatencyTable | None = None
        self.budget_ms: dict[int, float] = {}
        self._current = ArrayRecord()
        self._sent: dict[int, _Sent] = {}
        self._scoring = ("search-t1", 0)  # (ledger stage, paths) of configure_evaluate

    rounds_setting = "train.rounds"

    def summary(self) -> None:
        s = self.settings
        log(
            INFO,
            "\t├── FedorAS Stage 1: %d rounds, %d clients/round, %d tiers of %s",
            s.train.rounds,
            s.train.clients_per_round,
            s.num_tiers,
            "latency (ms, the nodes' own tables)" if s.resource == "latency" else "FLOPs",
        )
        log(
            INFO,
            "\t├── supernet %d elements, comm budget %d (%.0f%%)",
            self.space.total_size,
            self.comm_size,
            100 * s.comm_budget,
        )
        log(
            INFO,
            "\t└── local: %d epoch(s), batch %d, SGD lr %g momentum %g",
            s.train.local_epochs,
            s.train.batch_size,
            s.train.lr,
            s.train.momentum,
        )

    # --- setup ---------------------------------------------------------------

    def setup(self, grid: Grid) -> None:
        """Profile the nodes, define the tiers and put every node in one."""
        profiles = self.profile_nodes(grid, ConfigRecord({"method": "fedoras"}))
        s = self.settings
        latency = s.resource == "latency"
        if latency:
            profiles = self._query_tables(grid, profiles)
        self.tiers = compute_tiers(
            self.space,
            self.rng("tiers"),
            num_tiers=s.num_tiers,
            num_samples=s.tier_samples,
            rho_low=s.rho_low,
            rho_high=s.rho_high,
            cost=PathCost(self.space, self.all_table),
        )
        # A node may declare its tier (node config ``tier``, 1 = lowest, as in the paper's T1..).
        declared = {
            p.partition_id: p.tier - 1 for p in profiles.values() if 1 <= p.tier <= s.num_tiers
        }
        for p in profiles.values():
            if p.tier != -1 and p.partition_id not in declared:
                log(
                    WARNING,
                    "node %d declares tier %d, outside 1..%d: assigned one instead",
                    p.node_id,
                    p.tier,
                    s.num_tiers,
                )
        budgeted = self._tiers_of_budgets(profiles) if latency else {}
        free = [p for p in profiles.values() if p.partition_id not in budgeted]
        assigned = assign_tiers(
            [p.partition_id for p in free],
            s.num_tiers,
            self.rng("assign-tiers"),
            s.tier_proportions,
            self._slowness(free) if latency else None,
        )
        self.tier_of_partition = {**assigned, **budgeted, **declared}
        if not s.tier_aware:  # the tier-unaware baseline: every client in the top tier
            top = s.num_tiers - 1
            self.tier_of_partition = {pid: top for pid in self.tier_of_partition}
            log(INFO, "Tier-unaware: every client may train and run every path")
        cost = PathCost(self.space, self.all_table)
        for tier in self.tiers:
            members = sum(1 for t in self.tier_of_partition.values() if t == tier.index)
            bounds = f"{cost.unit} ({tier.low:.4g}, {tier.high:.4g}]"
            if cost.table is None:  # FLOPs: the same bounds in MACs, the papers' unit
                low, high = flops_to_macs(tier.low), flops_to_macs(tier.high)
                bounds += f" = MACs ({low:.4g}, {high:.4g}]"
            log(INFO, "Tier %d: %s, %d client(s)", tier.index + 1, bounds, members)
        if latency:
            self._latency_budgets()

    # --- fedoras.resource = "latency" ------------------------------------------------

    def _query_tables(
        self, grid: Grid, profiles: Mapping[int, NodeProfile]
    ) -> dict[int, NodeProfile]:
        """Every profiled node's latency table of the space (``query.latency``; a node
        answers a repeated query, e.g. on resume, from its cache). A node without a
        well-formed table is left out of the run (logged); the profiles of the rest."""
        self.query_latency(grid, self.space, request=self.latency_request)
        spec = dict(self.space.spec)
        self.node_tables = {
            n: t for n, t in self.latency_tables.items() if n in profiles and dict(t.spec) == spec
        }
        for node_id in sorted(set(profiles) - set(self.node_tables)):
            log(WARNING, "node %d: no latency table; left out of this run", node_id)
            del self.profiles[node_id]
        if not self.node_tables:
            raise ValueError("fedoras.resource = 'latency': no node returned a latency table")
        self.all_table = group_table([self.node_tables[n] for n in sorted(self.node_tables)])
        return {n: p for n, p in profiles.items() if n in self.node_tables}

    def _tiers_of_budgets(self, profiles: Mapping[int, NodeProfile]) -> dict[int, int]:
        """Nodes declaring ``latency-budget-ms``: the largest tier whose upper bound is
        within the budget (below every tier: the lowest, with a warning)."""
        tiers: dict[int, int] = {}
        for p in profiles.values():
            if p.latency_budget_ms <= 0:
                continue
            fits = [t.index for t in self.tiers if t.high <= p.latency_budget_ms]
            if not fits:
                log(
                    WARNING,
                    "node %d: latency-budget-ms = %g is below every tier (the lowest ends at "
                    "%.4g ms): put in tier 1",
                    p.node_id,
                    p.latency_budget_ms,
                    self.tiers[0].high,
                )
            tiers[p.partition_id] = max(fits, default=0)
        return tiers

    def _slowness(self, profiles: Sequence[NodeProfile]) -> dict[int, float]:
        """Per partition, the median latency of a fixed sample of paths on its node's own
        table: the order in which nodes without a budget are dealt into tiers."""
        rng = self.rng("node-speed")
        paths = [self.space.sample_path(rng) for _ in range(SPEED_PATHS)]
        return {
            p.partition_id: float(
                np.median([self.node_tables[p.node_id].path_ms(a) for a in paths])
            )
            for p in profiles
        }

    def _latency_budgets(self) -> None:
        """Each tier's table (the median of its nodes' tables; none: every node's) and
        each node's Stage-1 budget on its own table: its declared ``latency-budget-ms``,
        else its tier's upper bound (raised to its own cheapest path, with a warning)."""
        tier_of = {n: self.tier_of_node(n) for n in self.profiles}
        for tier in self.tiers:
            members = [self.node_tables[n] for n in sorted(tier_of) if tier_of[n] == tier.index]
            self.tier_tables[tier.index] = group_table(members) if members else self.all_table
        for node_id, profile in sorted(self.profiles.items()):
            own = PathCost(self.space, self.node_tables[node_id])
            if not self.settings.tier_aware:
                budget = own.highest()
            elif profile.latency_budget_ms > 0:
                budget = profile.latency_budget_ms
            else:
                budget = self.tiers[tier_of[node_id]].high
            if budget < own.lowest():
                log(
                    WARNING,
                    "node %d: its budget %.4g ms is below its own fastest path (%.4g ms): "
                    "it trains its fastest paths",
                    node_id,
                    budget,
                    own.lowest(),
                )
                budget = own.lowest()
            self.budget_ms[node_id] = budget

    def tier_cost(self, tier: int) -> PathCost:
        """What tier ``tier`` bounds: FLOPs, or latency on the tier's table."""
        return PathCost(self.space, self.tier_tables.get(tier))

    def admit_late(self, profile: NodeProfile) -> str | None:
        """A node profiled mid-run joins in its partition's tier; a partition the tiers
        were not dealt to, or (resource latency) a node whose table was never measured,
        cannot join."""
        if profile.partition_id not in self.tier_of_partition:
            return f"partition {profile.partition_id} was given no tier at the start"
        if self.settings.resource == "latency":
            return "fedoras.resource = 'latency': its latency table was not measured at the start"
        return None

    def tier_of_node(self, node_id: int) -> int:
        return self.tier_of_partition[self.profiles[node_id].partition_id]

    def stage_context(self) -> StageContext:
        """What Stages 2 and 3 use of this run (after ``setup``): see ``context``."""
        return StageContext(
            federation=self,
            space=self.space,
            settings=self.settings,
            nodes=dict(self.profiles),
            tier_of={node_id: self.tier_of_node(node_id) for node_id in self.profiles},
            server_scorer=self.server_scorer,
        )

    # --- one round -------------------------------------------------------------

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Sample clients; give each a subspace within B_comm and its tier's budget."""
        candidates = self.connected_profiles(grid)
        chosen = sample_nodes(
            self.rng("sample", server_round), candidates, self.settings.train.clients_per_round
        )
        self._current = arrays
        self._sent = {}
        messages = []
        for profile in chosen:
            tier = self.tiers[self.tier_of_node(profile.node_id)]
            cost, budget = self._client_cost(profile.node_id, tier)
            subspace = cost.sample_subspace(
                self.rng("subspace", server_round, profile.partition_id), self.comm_size, budget
            )
            sub_arrays = ArrayRecord({k: arrays[k] for k in self.space.subspace_keys(subspace)})
            self._sent[profile.node_id] = _Sent(tier.index, subspace, array_specs(sub_arrays))
            message_config = ConfigRecord(
                {
                    **dict(config),
                    **self._client_config(server_round, tier, subspace),
                    **self._latency_config(profile.node_id),
                }
            )
            messages.append(
                Message(
                    content=RecordDict({ARRAYS: sub_arrays, CONFIG: message_config}),
                    message_type=FEDORAS_SUPERNET,
                    dst_node_id=profile.node_id,
                )
            )
        log(DEBUG, "configure_train: %d client(s) of %d", len(messages), len(candidates))
        return self.instruct("train", STAGE_SUPERNET, server_round, messages)

    def _client_cost(self, node_id: int, tier: Tier) -> tuple[PathCost, float]:
        """What a node's Stage-1 paths must fit: its tier's FLOPs, or its latency budget
        on its own table."""
        if self.settings.resource != "latency":
            return PathCost(self.space), tier.high
        return PathCost(self.space, self.node_tables[node_id]), self.budget_ms[node_id]

    def _latency_config(self, node_id: int) -> dict[str, Any]:
        if self.settings.resource != "latency":
            return {}
        table = self.node_tables[node_id]
        return {
            "resource": "latency",
            "max-flops": float(self.space.max_flops()),
            "max-latency-ms": float(self.budget_ms[node_id]),
            "latency-option-ms": [float(v) for layer in table.option_ms for v in layer],
            "latency-fixed-ms": float(table.fixed_ms),
        }

    def _client_config(self, server_round: int, tier: Tier, subspace: Subspace) -> dict[str, Any]:
        s = self.settings
        return {
            "method": "fedoras",
            "phase": STAGE_SUPERNET,
            "server-round": server_round,
            "seed": self.seed,
            "tier": tier.index,
            "max-flops": float(tier.high),
            "subspace-mask": self.space.subspace_mask(subspace),
            **s.train.client_config(),
            "grad-clip": s.grad_clip,
            "return-all": s.aggregation == "fedavg",
            **space_to_config(self.space.spec),
        }

    def check_train_reply(self, reply: Message) -> str | None:
        """Why a Stage-1 reply is unusable, or ``None``."""
        sent = self._sent.get(reply.metadata.src_node_id)
        if sent is None:
            return "reply from a node that was not asked"
        claim = self.claim(
            reply.metadata.src_node_id, "train", epochs=self.settings.train.local_epochs
        )
        reason = check_reply(
            reply,
            sent=sent.specs,
            counts=("num-examples", "train-flops", "option-counts"),
            bounds={"num-examples": claim, "option-counts": claim},
        )
        if reason is not None:
            return reason
        metrics = reply.content.metric_records[METRICS]
        counts = metrics["option-counts"]
        sizes = self.space.num_options()
        if not isinstance(counts, list) or len(counts) != sum(sizes):
            return (
                f"option-counts has {len(counts) if isinstance(counts, list) else 1} "
                f"entries, expected {sum(sizes)}"
            )
        examples = int(metrics["num-examples"])
        if examples < 1:
            return "num-examples is 0"
        mask = self.space.subspace_mask(sent.subspace)
        if any(c > 0 and not m for c, m in zip(counts, mask, strict=True)):
            return "option-counts names an option outside the subspace sent"
        start = 0
        for layer, size in enumerate(sizes):
            if sum(counts[start : start + size]) != examples:
                return f"option-counts of layer {layer} do not sum to num-examples ({examples})"
            start += size
        returned = set(reply.content.array_records[ARRAYS].keys())
        if self.settings.aggregation == "fedavg":
            touched = set(sent.specs)  # plain FedAvg: every key sent comes back
        else:
            touched = set(self.space.fixed_keys())
            for (layer, option), count in zip(self._options(), counts, strict=True):
                if count > 0:
                    touched.update(self.space.op_keys(layer, option))
        if returned != touched:
            return (
                f"returned keys differ from the options trained ({len(returned ^ touched)} key(s))"
            )
        return None

    def _options(self) -> list[tuple[int, int]]:
        return [(layer, o) for layer, n in enumerate(self.space.num_options()) for o in range(n)]

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """OPA (or, as the comparison, plain FedAvg: every returned key weighted by the
        client's examples) over the accepted replies; metrics: loss, examples, clients."""
        screened = self.screened(STAGE_SUPERNET, "train", replies)
        accepted = self.accept(STAGE_SUPERNET, screened, self.check_train_reply)
        self.require(STAGE_SUPERNET, len(accepted), len(self._sent))
        updates = []
        loss_sum = 0.0
        examples = 0
        for reply in accepted:
            metrics = reply.content.metric_records[METRICS]
            n = int(metrics["num-examples"])
            returned = reply.content.array_records[ARRAYS]
            per_key = dict.fromkeys(self.space.fixed_keys(), n)
            if self.settings.aggregation == "fedavg":
                per_key = dict.fromkeys(returned.keys(), n)
            else:
                for (layer, option), count in zip(
                    self._options(), metrics["option-counts"], strict=True
                ):
                    for key in self.space.op_keys(layer, option):
                        per_key[key] = int(count)
            updates.append((reply.content.array_records[ARRAYS], per_key))
            self.ledger.node(STAGE_SUPERNET, reply.metadata.src_node_id).train_flops += int(
                metrics["train-flops"]
            )
            loss_sum += float(metrics["train-loss"]) * n
            examples += n
        arrays = opa(self._current, updates, aggregation=self.aggregation)
        return arrays, MetricRecord(
            {
                "train-loss": loss_sum / examples,
                "num-examples": examples,
                "clients": len(accepted),
            }
        )

    # --- federated evaluation: Stage-2 path scoring ------------------------------------

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Stage 2's federated scoring as Flower's hook (after ``setup``): score the paths
        ``config["paths"]`` (flat, layer-major) of tier ``config["tier"]`` (0-based) of the
        supernet ``arrays`` on sampled clients of that tier and above
        (``evaluate.fedoras_paths``; ``server_round`` is the generation)."""
        tier = int(config["tier"])
        values = config["paths"]
        flat = [int(v) for v in values] if isinstance(values, list) else [int(values)]
        layers = len(self.space.num_options())
        paths = [tuple(flat[i : i + layers]) for i in range(0, len(flat), layers)]
        self._scoring = (f"search-t{tier + 1}", len(paths))
        messages = path_messages(self.stage_context(), grid, arrays, tier, paths, server_round)
        return self.instruct("evaluate", self._scoring[0], server_round, messages)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Each path's accuracy pooled over the accepted scoring replies (error and
        malformed replies skipped); ``None``: no usable reply."""
        stage, num_paths = self._scoring
        screened = self.screened(stage, "evaluate", replies)
        accepted = accepted_scores(self.stage_context(), stage, screened, num_paths)
        if not accepted:
            return None
        accuracy, examples = pooled_scores(accepted, num_paths)
        return MetricRecord(
            {"accuracy": accuracy, "num-examples": examples, "clients": len(accepted)}
        )

    # --- the three stages ---------------------------------------------------------

    def run(self, grid: Grid, initial_arrays: ArrayRecord) -> FedorASResult:
        """Profile the nodes, build the tiers, and run the stages up to
        ``settings.stop_after`` (run config ``fedoras.stop-after``).

        Flower's parameters: ``initial_arrays`` initialise the supernet (an empty
        ``ArrayRecord``: the space's own weights; with the constructor's
        ``supernet_trained``, a finished Stage 1); ``num_rounds`` is the number of
        Stage-1 rounds (``settings.train.rounds`` is replaced by it); ``timeout`` the reply
        timeout of every step; ``train_config`` / ``evaluate_config`` travel in every
        ``train.*`` / ``evaluate.*`` message; ``evaluate_fn(round, supernet)`` validates
        the Stage-1 supernet every ``settings.eval_every`` rounds and after the last.
        The constructor's ``resume`` continues a checkpointed run.
        """
        stop_after = self.settings.stop_after
        resume, supernet_trained = self.resume, self.supernet_trained
        log(INFO, "Starting FedorAS")
        self.summary()
        if resume is not None:
            self.ledger.restore(resume.ledger)
        with self.ledger.timed("setup"):
            self.setup(grid)
        arrays = initial_arrays if len(initial_arrays) else record_of(self.space.state_dict())
        if resume is not None:
            self._check_resumed_tiers(resume)
            arrays, supernet_trained = resume.arrays, not resume.within(STAGE_SUPERNET)
        result = FedorASResult(
            tiers=self.tiers,
            tier_of_partition=dict(self.tier_of_partition),
            resource=self.settings.resource,
            latency_tables=dict(self.node_tables),
            tier_tables=dict(self.tier_tables),
        )
        if supernet_trained:
            log(INFO, "Stage 1 skipped: resuming from a trained supernet")
            result.history = list(resume.history) if resume is not None else []
        else:
            arrays, result.history = self.train_supernet(grid, arrays, resume)
        self.contract_result(result, arrays)
        if stop_after != "supernet":
            self.reached("search", 0)
            result.searches, result.kendall_tau = self.search(grid, result.arrays)
            searches = [s.summary() for s in result.searches]
            self._reached_stage_end("search", len(searches), result, searches=searches)
        if stop_after == "finetune":
            self.reached("finetune", 0)
            result.models = self.finetune(grid, result.arrays, result.searches)
            if self.settings.compare_random_search:
                result.models += self.random_search(grid, result.models)
            models = [m.summary() for m in result.models]
            self._reached_stage_end("finetune", len(models), result, models=models)
        result.ledger = self.ledger.summary()
        return result

    def _tier_progress(self) -> dict[str, Any]:
        return {
            "tiers": plain([asdict(t) for t in self.tiers]),
            "tier-of-partition": plain(self.tier_of_partition),
        }

    def _check_resumed_tiers(self, resume: Resume) -> None:
        """A resumed Stage 1 must see the tiers it was trained with (a Stage-1 file of
        an earlier version records none)."""
        saved = {k: resume.progress.get(k) for k in ("tiers", "tier-of-partition")}
        if resume.progress and saved != self._tier_progress():
            raise ValueError(
                f"run config 'resume-from' = {resume.path!r}: its tiers or tier assignment "
                f"{saved} differ from this run's {self._tier_progress()}; resume with the "
                "run config and the nodes of the run that wrote it"
            )

    def _reached_stage_end(
        self, stage: str, step: int, result: FedorASResult, **progress: Any
    ) -> None:
        self.reached(
            stage,
            step,
            result.arrays,
            history=result.history,
            stage_done=True,
            **self._tier_progress(),
            **progress,
        )

    def train_supernet(
        self, grid: Grid, arrays: ArrayRecord, resume: Resume | None = None
    ) -> tuple[ArrayRecord, list[dict[str, Any]]]:
        """Stage 1: ``rounds`` rounds of supernet training (with ``resume``, those after
        its last); the supernet and its history."""
        history: list[dict[str, Any]] = []
        first = 1
        if resume is not None and resume.within(STAGE_SUPERNET):
            history, first = [dict(h) for h in resume.history], resume.step + 1
            log(INFO, "Stage 1 resumed after round %d (%s)", resume.step, resume.path)
        else:
            self._evaluate(0, arrays, history, {})
        self.reached(STAGE_SUPERNET, first - 1)
        clock = StageClock(STAGE_SUPERNET, self.settings.train.rounds, first)
        for server_round in range(first, self.settings.train.rounds + 1):
            started = time.perf_counter()
            messages = list(self.configure_train(server_round, arrays, ConfigRecord(), grid))
            replies = self.exchange(grid, STAGE_SUPERNET, messages)
            new_arrays, metrics = self.aggregate_train(server_round, replies)
            arrays = new_arrays if new_arrays is not None else arrays
            if metrics is not None:
                self.train_metrics[server_round] = metrics
            entry = {
                "sent": len(messages),
                **dict(metrics or {}),
                "seconds": round(time.perf_counter() - started, 4),
            }
            self._evaluate(server_round, arrays, history, entry)
            log(INFO, "%s", clock.line(server_round, entry, keys=ROUND_KEYS))
            self.reached(
                STAGE_SUPERNET,
                server_round,
                arrays,
                history=history,
                stage_done=server_round == self.settings.train.rounds,
                **self._tier_progress(),
            )
        return arrays, history

    def search(
        self, grid: Grid, arrays: ArrayRecord
    ) -> tuple[list[TierSearch], dict[int, float | None]]:
        """Stage 2: NSGA-II per tier; with ``both`` scorings, Kendall-tau per tier."""
        s = self.settings
        if s.search_scoring != "federated" and self.server_scorer is None:
            raise ValueError(
                f"run config 'fedoras.search-scoring' = {s.search_scoring!r} needs a "
                "server-held validation slice, and this FedorAS was built without one "
                "('fedoras.stop-after' = \"supernet\")"
            )
        if self.server_scorer is not None:
            self.server_scorer.load(arrays)
        context = self.stage_context()
        searches, taus = [], {}
        clock = StageClock("search", len(self.tiers), label="tier")  # for the run's ETA
        for done, tier in enumerate(self.tiers, start=1):
            if s.search_scoring != "server" and not any(
                p.num_val > 0 for p in context.eligible(tier.index)
            ):
                log(WARNING, "Tier %d: no client to score its paths; not searched", tier.index + 1)
                continue
            log(DEBUG, "[SEARCH] tier %d: %s scoring", tier.index + 1, s.search_scoring)
            score = TierScorer(
                self.server_scorer,
                FederatedPathScorer(context, grid, arrays, tier.index)
                if s.search_scoring in ("federated", "both")
                else None,
            )
            with self.ledger.timed(f"search-t{tier.index + 1}"):
                outcome = search_tier(
                    self.space,
                    tier,
                    score,
                    seed=self.seed,
                    population=s.search_population,
                    offspring=s.search_offspring,
                    evaluations=s.search_evaluations,
                    objective="latency" if s.resource == "latency" else s.search_objective,
                    cost=self.tier_cost(tier.index),
                    placement=PathCost(self.space, self.all_table),
                )
            if not any(e.feasible for e in outcome.evaluated):
                log(
                    WARNING,
                    "Tier %d: no path scored lies in the tier%s; its model is the least "
                    "violating one",
                    tier.index + 1,
                    " on its devices' table" if s.resource == "latency" else "",
                )
            if s.search_scoring == "both":
                outcome.federated_accuracy = [score.recorded[e.path] for e in outcome.evaluated]
                taus[tier.index] = kendall_tau(
                    [e.accuracy for e in outcome.evaluated], outcome.federated_accuracy
                )
            log(
                INFO,
                "[SEARCH] tier %d: best %s, accuracy %.4f, %s%s",
                tier.index + 1,
                "-".join(self.space.option_names(outcome.best)),
                outcome.best_accuracy,
                describe_flops(self.space.cost(outcome.best).flops),
                self._latency_note(tier.index, outcome.best),
            )
            searches.append(outcome)
            clock.report(done)
        return searches, taus

    def _latency_note(self, tier: int, path: Sequence[int]) -> str:
        table = self.tier_tables.get(tier)
        return "" if table is None else f", {table.path_ms(path):.4g} ms on the tier's table"

    def _with_latency(self, model: TierModel) -> TierModel:
        """``model`` with its predicted latency on its tier's table (resource latency)."""
        table = self.tier_tables.get(model.tier)
        if table is not None:
            model.latency_ms = table.path_ms(model.arch)
        return model

    def finetune(
        self, grid: Grid, arrays: ArrayRecord, searches: Sequence[TierSearch]
    ) -> list[TierModel]:
        """Stage 3: fine-tune each tier's path on that tier's clients and those above
        (and, with ``compare-rand-init``, the same path from a random initialisation)."""
        inits = [SUPERNET_INIT] + ([RANDOM_INIT] if self.settings.compare_rand_init else [])
        context = self.stage_context()
        models = []
        for outcome in searches:
            if not context.eligible(outcome.tier):
                log(
                    WARNING,
                    "Tier %d: no client can run its model; not fine-tuned",
                    outcome.tier + 1,
                )
                continue
            for init in inits:
                models.append(
                    self._with_latency(
                        finetune_tier(
                            context,
                            grid,
                            arrays,
                            outcome.tier,
                            outcome.best,
                            outcome.best_accuracy,
                            init=init,
                            server_data=self.server_data,
                            rounds=self.settings.rand_init_rounds if init == RANDOM_INIT else None,
                            clients_per_round=(
                                self.settings.rand_init_clients_per_round
                                if init == RANDOM_INIT
                                else None
                            ),
                        )
                    )
                )
        return models

    def client_compute(self) -> int:
        """Client training FLOPs FedorAS itself has spent: Stage 1 and the fine-tuning of
        the supernet-initialised models (not the comparisons)."""
        stages = [STAGE_SUPERNET] + [
            stage
            for stage in self.ledger.summary()
            if stage.startswith("finetune-") and stage.endswith(f"-{SUPERNET_INIT}")
        ]
        return sum(self.ledger.stage_totals(stage).train_flops for stage in stages)

    def random_search(self, grid: Grid, models: Sequence[TierModel]) -> list[TierModel]:
        """The random-search comparison: per fine-tuned tier, random paths trained from
        scratch with an equal share of FedorAS's total client compute."""
        tiers = sorted({m.tier for m in models if m.init == SUPERNET_INIT})
        if not tiers:
            return []
        budget = self.client_compute() / len(tiers)
        log(
            INFO,
            "[random search] %.4g client training FLOPs (%.4g MACs) per tier",
            budget,
            flops_to_macs(budget),
        )
        context = self.stage_context()
        return [
            self._with_latency(
                random_search_tier(
                    context,
                    grid,
                    self.tiers[t],
                    budget,
                    server_data=self.server_data,
                    cost=self.tier_cost(t),
                    placement=PathCost(self.space, self.all_table),
                )
            )
            for t in tiers
        ]

    def _evaluate(
        self,
        server_round: int,
        arrays: ArrayRecord,
        history: list[dict[str, Any]],
        entry: dict[str, Any],
    ) -> None:
        last = server_round == self.settings.train.rounds
        self.record_step(
            server_round, arrays, history, entry, every=self.settings.eval_every, last=last
        )
