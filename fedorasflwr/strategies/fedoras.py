"""FedorAS (Dudziak et al., "FedorAS: Federated Architecture Search under
system heterogeneity", arXiv:2206.11239): Stage 1, federated supernet training.

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
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from ..config import FedorASSettings
from ..protocol import ARRAYS, CONFIG, FEDORAS_SUPERNET, METRICS, space_to_config
from ..search_spaces import SearchSpace, Subspace
from .aggregation import opa
from .base import FederatedNASStrategy, NodeProfile, sample_nodes
from .replies import ArraySpec, array_specs, check_reply
from .tiers import Tier, assign_tiers, compute_tiers

__all__ = ["FedorAS", "FedorASResult"]

STAGE_SUPERNET = "supernet"


@dataclass
class FedorASResult:
    """What ``FedorAS.start`` returns."""

    arrays: ArrayRecord
    tiers: list[Tier]
    tier_of_partition: dict[int, int]
    history: list[dict[str, Any]] = field(default_factory=list)
    ledger: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Sent:
    tier: int
    subspace: Subspace
    specs: dict[str, ArraySpec]


class FedorAS(FederatedNASStrategy):
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
        supernet (accuracy over random paths), every ``eval_every`` rounds.
    validate_profiles : callable, optional
        Called with the node profiles before any training; raise to stop
        (e.g. a data partition that cannot exist).
    reply_timeout, min_nodes
        See ``FederatedNASStrategy``.
    """

    def __init__(
        self,
        *,
        space: SearchSpace,
        settings: FedorASSettings,
        seed: int,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
        validate_profiles: Callable[[Sequence[NodeProfile]], None] | None = None,
        reply_timeout: float = 600.0,
        min_nodes: int = 2,
    ) -> None:
        super().__init__(
            seed=seed,
            min_replies=settings.min_replies,
            reply_timeout=reply_timeout,
            min_nodes=min_nodes,
        )
        self.space = space
        self.settings = settings
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
        self.tiers: list[Tier] = []
        self.tier_of_partition: dict[int, int] = {}
        self._current = ArrayRecord()
        self._sent: dict[int, _Sent] = {}

    def summary(self) -> None:
        s = self.settings
        log(
            INFO,
            "\t├── FedorAS Stage 1: %d rounds, %d clients/round, %d tiers",
            s.rounds,
            s.clients_per_round,
            s.num_tiers,
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
            s.local_epochs,
            s.batch_size,
            s.lr,
            s.momentum,
        )

    # --- setup ---------------------------------------------------------------

    def setup(self, grid: Grid) -> None:
        """Profile the nodes, define the tiers and put every node in one."""
        profiles = self.profile_nodes(grid, ConfigRecord({"method": "fedoras"}))
        if self.validate_profiles is not None:
            self.validate_profiles(list(profiles.values()))
        s = self.settings
        self.tiers = compute_tiers(
            self.space,
            self.rng("tiers"),
            num_tiers=s.num_tiers,
            num_samples=s.tier_samples,
            rho_low=s.rho_low,
            rho_high=s.rho_high,
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
        assigned = assign_tiers(
            [p.partition_id for p in profiles.values()],
            s.num_tiers,
            self.rng("assign-tiers"),
            s.tier_proportions,
        )
        self.tier_of_partition = {**assigned, **declared}
        for tier in self.tiers:
            members = sum(1 for t in self.tier_of_partition.values() if t == tier.index)
            log(
                INFO,
                "Tier %d: FLOPs (%.4g, %.4g], %d client(s)",
                tier.index + 1,
                tier.low,
                tier.high,
                members,
            )

    def tier_of_node(self, node_id: int) -> int:
        return self.tier_of_partition[self.profiles[node_id].partition_id]

    # --- one round -------------------------------------------------------------

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Sample clients; give each a subspace within B_comm and its tier's budget."""
        connected = set(grid.get_node_ids())
        candidates = [p for p in self.profiles.values() if p.node_id in connected]
        chosen = sample_nodes(
            self.rng("sample", server_round), candidates, self.settings.clients_per_round
        )
        self._current = arrays
        self._sent = {}
        messages = []
        for profile in chosen:
            tier = self.tiers[self.tier_of_node(profile.node_id)]
            subspace = self.space.sample_subspace(
                self.rng("subspace", server_round, profile.partition_id),
                max_size=self.comm_size,
                max_flops=tier.high,
            )
            sub_arrays = ArrayRecord({k: arrays[k] for k in self.space.subspace_keys(subspace)})
            self._sent[profile.node_id] = _Sent(tier.index, subspace, array_specs(sub_arrays))
            message_config = ConfigRecord(
                {
                    **dict(config),
                    **self._client_config(server_round, tier, subspace),
                }
            )
            messages.append(
                Message(
                    content=RecordDict({ARRAYS: sub_arrays, CONFIG: message_config}),
                    message_type=FEDORAS_SUPERNET,
                    dst_node_id=profile.node_id,
                )
            )
        log(INFO, "configure_train: %d client(s) of %d", len(messages), len(candidates))
        return messages

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
            "local-epochs": s.local_epochs,
            "batch-size": s.batch_size,
            "lr": s.lr,
            "momentum": s.momentum,
            "weight-decay": s.weight_decay,
            **space_to_config(self.space.spec),
        }

    def check_train_reply(self, reply: Message) -> str | None:
        """Why a Stage-1 reply is unusable, or ``None``."""
        sent = self._sent.get(reply.metadata.src_node_id)
        if sent is None:
            return "reply from a node that was not asked"
        reason = check_reply(
            reply, sent=sent.specs, counts=("num-examples", "train-flops", "option-counts")
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
        """OPA over the accepted replies; metrics: loss, FLOPs, bytes, counts."""
        accepted = self.accept(STAGE_SUPERNET, replies, self.check_train_reply)
        self.require(STAGE_SUPERNET, len(accepted), len(self._sent))
        updates = []
        loss_sum = 0.0
        examples = 0
        for reply in accepted:
            metrics = reply.content.metric_records[METRICS]
            n = int(metrics["num-examples"])
            per_key = dict.fromkeys(self.space.fixed_keys(), n)
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
        arrays = opa(self._current, updates)
        return arrays, MetricRecord(
            {
                "train-loss": loss_sum / examples,
                "num-examples": examples,
                "clients": len(accepted),
            }
        )

    # --- the whole stage ---------------------------------------------------------

    def start(  # type: ignore[override]
        self, grid: Grid, initial_arrays: ArrayRecord | None = None
    ) -> FedorASResult:
        """Profile, build tiers, and run Stage 1; return supernet, tiers, history, ledger."""
        log(INFO, "Starting FedorAS")
        self.summary()
        with self.ledger.timed("setup"):
            self.setup(grid)
        arrays = (
            initial_arrays if initial_arrays is not None else ArrayRecord(self.space.state_dict())
        )
        history: list[dict[str, Any]] = []
        self._evaluate(0, arrays, history, {})
        for server_round in range(1, self.settings.rounds + 1):
            log(INFO, "[SUPERNET ROUND %d/%d]", server_round, self.settings.rounds)
            started = time.perf_counter()
            messages = list(self.configure_train(server_round, arrays, ConfigRecord(), grid))
            replies = self.exchange(grid, STAGE_SUPERNET, messages)
            new_arrays, metrics = self.aggregate_train(server_round, replies)
            arrays = new_arrays if new_arrays is not None else arrays
            entry = {
                "sent": len(messages),
                **dict(metrics or {}),
                "seconds": round(time.perf_counter() - started, 4),
            }
            self._evaluate(server_round, arrays, history, entry)
        return FedorASResult(
            arrays=arrays,
            tiers=self.tiers,
            tier_of_partition=dict(self.tier_of_partition),
            history=history,
            ledger=self.ledger.summary(),
        )

    def _evaluate(
        self,
        server_round: int,
        arrays: ArrayRecord,
        history: list[dict[str, Any]],
        entry: dict[str, Any],
    ) -> None:
        last = server_round == self.settings.rounds
        self.record_step(
            server_round, arrays, history, entry, every=self.settings.eval_every, last=last
        )
