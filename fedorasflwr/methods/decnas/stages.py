"""What DecNAS does around its search: the frontier's records, federated evaluation,
FedAvg stages (GM_0 training, long-term tuning) and the width-multiplier baseline.

``PrunedModelStages`` is the base of :class:`~.decnas.DecNAS`; it knows how to
send a pruned model (its ``spec`` plus ``state_dict``) to clients, how to
FedAvg-train it with ``SeededFedAvg`` and how to score it on the clients'
validation or test splits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from ...arrays import record_of, state_dict_of
from ...artifacts import check_weights
from ...checkpoints import Resume
from ...costs import COST_CONVENTION, macs_to_flops
from ...federation.aggregation import Aggregation
from ...federation.base import FederatedNASStrategy, NodeProfile, ProfileRules
from ...federation.fedavg import SeededFedAvg
from ...federation.replies import check_reply
from ...latency import LatencyRequest, LatencyTable
from ...protocol import ARRAYS, CONFIG, METRICS, space_to_config
from ...search_spaces.importable import require_importable
from ...search_spaces.prunable import (
    PrunableNet,
    build_prunable,
    load_prunable,
    resource,
    width_scaled,
)
from ...seeding import seed_torch
from .latency import LayerLayout, predict_ms
from .messages import DECNAS_EVALUATE, DECNAS_TRAIN
from .settings import DecNASSettings

__all__ = ["DecNASResult", "GlobalModel", "PrunedModelStages"]

#: DecNAS's stages as checkpoints name them
GM0, ITERATIONS, FINAL = "gm0", "iterations", "final"


@dataclass
class GlobalModel:
    """GM_t: one point of the accuracy/resource frontier (MACs = FLOPs / 2, one sample)."""

    iteration: int
    spec: dict[str, Any]
    arrays: ArrayRecord
    macs: int
    params: int
    val_accuracy: float
    pruned_layer: int | None = None
    budget: float | None = None
    test_accuracy: float | None = None
    tuned_test_accuracy: float | None = None
    tuned_arrays: ArrayRecord | None = None
    latency_ms: float | None = None  # predicted on the target devices' table (resource latency)
    # on the server's global test set (data.global-test; set by the app's runner,
    # runs.GlobalTest): GM_t as searched, as tuned, and the set's samples
    global_test_accuracy: float | None = None
    tuned_global_test_accuracy: float | None = None
    global_test_count: int | None = None

    @property
    def widths(self) -> list[int]:
        """Filters per prunable layer (the architecture)."""
        return list(self.spec["widths"])

    def net(self, tuned: bool = False) -> PrunableNet:
        """GM_t as a module: the pruned net of ``spec`` holding ``arrays`` (``tuned``: the
        FedAvg-tuned ``tuned_arrays``), on the CPU; ``save_model`` writes it."""
        arrays = self.tuned_arrays if tuned else self.arrays
        if arrays is None:
            raise ValueError(f"GM_{self.iteration} was not tuned: it has no tuned_arrays")
        return load_prunable(self.spec, state_dict_of(arrays))

    @property
    def flops(self) -> int:
        """FLOPs of one sample (``2 x macs``, as ``torch.utils.flop_counter`` counts)."""
        return int(macs_to_flops(self.macs))

    def summary(self) -> dict[str, Any]:
        """JSON-ready: architecture, budget, cost and accuracies (``None``: not measured)."""
        return {
            "iteration": self.iteration,
            "widths": self.widths,
            "pruned-layer": self.pruned_layer,
            "budget": self.budget,
            "macs": self.macs,
            "flops": self.flops,
            "params": self.params,
            "latency-ms": self.latency_ms,
            "search-val-accuracy": None if math.isnan(self.val_accuracy) else self.val_accuracy,
            "test-accuracy": self.test_accuracy,
            "tuned-test-accuracy": self.tuned_test_accuracy,
            **(
                {}
                if self.global_test_count is None
                else {
                    "global-test-accuracy": self.global_test_accuracy,
                    "tuned-global-test-accuracy": self.tuned_global_test_accuracy,
                    "global-test-count": self.global_test_count,
                }
            ),
        }


@dataclass(kw_only=True, repr=False)
class DecNASResult(Result):
    """What ``DecNAS.start`` returns: Flower's ``Result`` (``arrays``: the last GM_T as
    FL-tuned, the model to deploy, or GM_T as searched where no tuning ran; per iteration t
    the chosen GM_t's validation accuracy and cost, and ``evaluate_fn``'s metrics of GM_t),
    ``untuned_arrays`` (GM_T as searched), the frontier GM_0..GM_T, histories, baselines,
    ledger. Every field is described in docs/decnas.md."""

    untuned_arrays: ArrayRecord = field(default_factory=ArrayRecord)
    frontier: list[GlobalModel] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    groups: list[dict[str, Any]] = field(default_factory=list)
    ledger: dict[str, Any] = field(default_factory=dict)
    width_baseline: list[dict[str, Any]] = field(default_factory=list)
    latency: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """JSON-ready: the frontier, per-round history, groups, baseline and ledger (and
        with resource latency, the target devices' table: ``latency``)."""
        summary = {
            "resource-convention": COST_CONVENTION,
            "frontier": [model.summary() for model in self.frontier],
            "history": self.history,
            "groups": self.groups,
            "width-baseline": self.width_baseline,
            "ledger": self.ledger,
        }
        if self.latency:
            summary["resource-convention"] += (
                "; latency-ms: predicted at batch 1 by the target devices' layer table"
            )
            summary["latency"] = self.latency
        return summary

    def accuracy_points(self) -> dict[str, list[tuple[float, float]]]:
        """(MACs, test accuracy) per curve: the frontier before and after tuning, the baseline."""
        return {
            "DecNAS GM_t": [
                (m.macs, m.test_accuracy) for m in self.frontier if m.test_accuracy is not None
            ],
            "DecNAS GM_t, FL-tuned": [
                (m.macs, m.tuned_test_accuracy)
                for m in self.frontier
                if m.tuned_test_accuracy is not None
            ],
            "width multiplier": [(r["macs"], r["test-accuracy"]) for r in self.width_baseline],
        }


class PrunedModelStages(FederatedNASStrategy[DecNASResult]):
    """Federated evaluation and FedAvg of pruned models; the base of ``DecNAS``."""

    method = "decnas"

    def __init__(
        self,
        *,
        net: PrunableNet,
        settings: DecNASSettings,
        latency: LatencyRequest | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(net, PrunableNet):
            raise TypeError(
                f"DecNAS prunes a PrunableNet, got {type(net).__name__}: wrap the model's "
                "class, e.g. build_prunable(MyNet, num_classes=10, input_shape=(3, 32, 32))"
            )
        require_importable(net, type(self).__name__)
        super().__init__(min_replies=settings.min_replies, **kwargs)
        self.net = net
        self.settings = settings
        # how every aggregation combines a key's updates (settings.aggregation_rule)
        self.aggregation = Aggregation.of(settings)
        # resource "latency": how target nodes time their tables; the layout of GM_0's
        # units, the target nodes' tables and their per-entry median (set by the search)
        self.latency_request = latency
        self.layer_layout: LayerLayout | None = None
        self.target_tables: dict[int, LatencyTable] = {}
        self.layer_table: LatencyTable | None = None

    def profile_rules(self) -> ProfileRules:
        """The net's classes (``num_classes``; a net without: the length most nodes declare):
        the grouping adds the nodes' label histograms, which must have one length."""
        return ProfileRules.of_model(self.net, same_length=True)

    def train_config(self, spec: dict[str, Any], **extra: Any) -> dict[str, Any]:
        """The ConfigRecord content every DecNAS message about the model ``spec`` carries."""
        s = self.settings
        return {
            "method": self.method,
            "seed": self.seed,
            "server-round": 0,
            **s.train.client_config(),
            "net-macs": resource(spec, "macs"),
            **space_to_config(spec),
            **extra,
        }

    def load_net(self, spec: dict[str, Any], arrays: ArrayRecord) -> PrunableNet:
        """The structure ``spec`` holding ``arrays`` (``load_prunable``)."""
        return load_prunable(spec, state_dict_of(arrays))

    def global_model(
        self, net: PrunableNet, iteration: int, accuracy: float, **extra: Any
    ) -> GlobalModel:
        """``net`` recorded as GM_``iteration``."""
        cost = net.cost()
        latency = self.latency_cost
        return GlobalModel(
            iteration=iteration,
            spec=net.spec,
            arrays=record_of(net.state_dict()),
            macs=cost.flops // 2,
            params=cost.params,
            val_accuracy=accuracy,
            latency_ms=None if latency is None else latency(net.widths),
            **extra,
        )

    def _reached_frontier(
        self,
        stage: str,
        step: int,
        frontier: list[GlobalModel],
        history: list[dict[str, Any]],
        groups: list[dict[str, Any]],
        *,
        done: bool = False,
    ) -> None:
        """Report progress: the weights are GM_t's (with its spec); every GM travels."""
        saved = [
            {
                "iteration": m.iteration,
                "spec": m.spec,
                "state_dict": state_dict_of(m.arrays),
                "val-accuracy": m.val_accuracy,
                "pruned-layer": m.pruned_layer,
                "budget": m.budget,
            }
            for m in frontier
        ]
        self.reached(
            stage,
            step,
            frontier[-1].arrays,
            history=history,
            stage_done=done,
            space=frontier[-1].spec,
            frontier=saved,
            groups=groups,
        )

    def restore_frontier(self, resume: Resume) -> tuple[list[GlobalModel], list[dict[str, Any]]]:
        """GM_0..GM_t and the group summaries of ``resume``, each GM checked against this
        run's net (same model and image, weights that fit its widths, all finite)."""
        where = f"run config 'resume-from' = {resume.path!r}"
        base = {k: v for k, v in self.net.spec.items() if k != "widths"}
        frontier = []
        try:
            saved, groups = list(resume.progress["frontier"]), list(resume.progress["groups"])
            for index, entry in enumerate(saved):
                spec, state = dict(entry["spec"]), entry["state_dict"]
                if {k: v for k, v in spec.items() if k != "widths"} != base:
                    raise ValueError(f"GM_{index} is a {spec}, this run prunes a {self.net.spec}")
                if entry["iteration"] != index:
                    raise ValueError(f"entry {index} is GM_{entry['iteration']}")
                check_weights(f"GM_{index}", state, build_prunable(**spec).state_dict())
                net = self.load_net(spec, ArrayRecord(state))
                frontier.append(
                    self.global_model(
                        net,
                        index,
                        float(entry["val-accuracy"]),
                        pruned_layer=entry["pruned-layer"],
                        budget=entry["budget"],
                    )
                )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"{where}: its DecNAS frontier is unusable: {exc}") from exc
        if not frontier:
            raise ValueError(f"{where}: its DecNAS frontier is empty")
        return frontier, groups

    def resource_of(self, model: GlobalModel) -> float:
        """Res(model): its MACs, parameters or predicted latency (ms), as the settings say."""
        if self.settings.resource == "latency":
            if model.latency_ms is None:
                raise RuntimeError("resource latency: no latency table of the target devices")
            return model.latency_ms
        return model.macs if self.settings.resource == "macs" else model.params

    @property
    def latency_cost(self) -> Callable[[Sequence[int]], float] | None:
        """widths -> ms on the target devices' table (``None`` before it is measured)."""
        table, layout = self.layer_table, self.layer_layout
        if table is None or layout is None:
            return None
        return lambda widths: predict_ms(table, layout, widths)

    def cost_of(self, net: PrunableNet) -> float:
        """Res of ``net``: ``resource_of`` for a net that is not a GM."""
        if self.settings.resource == "latency":
            cost = self.latency_cost
            if cost is None:
                raise RuntimeError("resource latency: no latency table of the target devices")
            return cost(net.widths)
        return resource(net, self.settings.resource)

    def connected(self, grid: Grid) -> list[NodeProfile]:
        """Profiled nodes connected now, by partition id (nodes appearing mid-run profiled
        first: ``refresh_profiles``)."""
        return self.connected_profiles(grid)

    def evaluate(self, grid: Grid, model: GlobalModel, split: str, stage: str) -> float:
        """Accuracy of ``model`` pooled over every connected client's ``split`` (val/test)."""
        config = ConfigRecord(self.train_config(model.spec, split=split))
        messages = list(self.configure_evaluate(model.iteration, model.arrays, config, grid))
        replies = self.exchange(grid, stage, messages)
        metrics = self.aggregate_evaluate(model.iteration, replies, stage=stage, split=split)
        self.require(stage, int(metrics["clients"]) if metrics else 0, len(messages))
        return float(metrics["accuracy"]) if metrics else math.nan

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The model ``arrays`` to every connected client; ``config`` carries its spec
        (``space.<kwarg>``) and the ``split`` to score, "val" or "test"."""
        messages = [
            Message(
                RecordDict({ARRAYS: arrays, CONFIG: config}),
                message_type=DECNAS_EVALUATE,
                dst_node_id=p.node_id,
            )
            for p in self.connected(grid)
        ]
        return self.instruct("evaluate", "evaluate", server_round, messages)

    def aggregate_evaluate(
        self,
        server_round: int,
        replies: Iterable[Message],
        *,
        stage: str = "evaluate",
        split: str = "val",
    ) -> MetricRecord | None:
        """Accuracy pooled over the accepted replies (``correct`` / ``num-examples``);
        error and malformed replies are skipped. ``None``: no usable reply.

        ``split`` is the one ``configure_evaluate``'s config named (the counts are checked
        against each node's claim for it); ``stage`` the ledger's stage of the replies."""
        accepted = self.accept(
            stage,
            self.screened(stage, "evaluate", replies),
            lambda r: check_reply(
                r,
                counts=("num-examples", "correct"),
                bounds=dict.fromkeys(
                    ("num-examples", "correct"), self.claim(r.metadata.src_node_id, split)
                ),
            ),
        )
        if not accepted:
            return None
        correct = sum(int(r.content.metric_records[METRICS]["correct"]) for r in accepted)
        count = sum(int(r.content.metric_records[METRICS]["num-examples"]) for r in accepted)
        return MetricRecord(
            {
                "accuracy": correct / max(count, 1),
                "correct": correct,
                "num-examples": count,
                "clients": len(accepted),
            }
        )

    def fedavg(
        self, grid: Grid, spec: dict[str, Any], arrays: ArrayRecord, rounds: int, stage: str
    ) -> ArrayRecord:
        """``rounds`` rounds of FedAvg over the profiled clients (Flower's, seeded)."""
        if rounds == 0:
            return arrays
        self.refresh_profiles(grid)
        nodes = list(self.profiles.values())
        strategy = SeededFedAvg(
            nodes=nodes,
            seed=self.seed,
            stage=stage,
            ledger=self.ledger,
            clients_per_round=self.settings.train.clients_per_round or len(nodes),
            min_replies=min(self.min_replies, len(nodes)),
            train_message_type=DECNAS_TRAIN,
            fraction_evaluate=0.0,
            aggregation=self.aggregation,
        )
        with self.ledger.timed(stage):
            result = strategy.start(
                grid,
                arrays,
                num_rounds=rounds,
                timeout=self.reply_timeout,
                train_config=self.with_user_config(DECNAS_TRAIN, self.train_config(spec)),
            )
        return result.arrays

    def finish(self, grid: Grid, frontier: list[GlobalModel]) -> None:
        """Test every GM; FedAvg-tune GM_T (``final-models`` "last") or every GM_t, t >= 1
        ("all"), for ``final-rounds`` rounds, and test the tuned models."""
        for model in frontier:
            model.test_accuracy = self.evaluate(grid, model, "test", "test")
        chosen = frontier[1:] if self.settings.final_models == "all" else frontier[-1:]
        for model in chosen:
            if model.iteration == 0:
                continue
            stage = f"final-gm{model.iteration}"
            model.tuned_arrays = self.fedavg(
                grid, model.spec, model.arrays, self.settings.final_rounds, stage
            )
            tuned = replace(model, arrays=model.tuned_arrays)
            model.tuned_test_accuracy = self.evaluate(grid, tuned, "test", "test")

    def width_baseline(self, grid: Grid, frontier: list[GlobalModel]) -> list[dict[str, Any]]:
        """Width multiplier: GM_0's structure scaled uniformly to each GM_t's budget, trained
        from scratch with FedAvg for as many rounds as GM_0 and the tuning got together."""
        rows = []
        for model in frontier[1:]:
            seed_torch(self.seed, "width", model.iteration)
            net = width_scaled(
                self.net, self.resource_of(model), self.settings.resource, cost=self.latency_cost
            )
            rounds = self.settings.train.rounds + self.settings.final_rounds
            stage = f"width-{model.iteration}"
            arrays = self.fedavg(grid, net.spec, record_of(net.state_dict()), rounds, stage)
            scaled = self.global_model(self.load_net(net.spec, arrays), model.iteration, math.nan)
            rows.append(
                {
                    "iteration": model.iteration,
                    "widths": scaled.widths,
                    "macs": scaled.macs,
                    "flops": scaled.flops,
                    "params": scaled.params,
                    "latency-ms": scaled.latency_ms,
                    "rounds": rounds,
                    "test-accuracy": self.evaluate(grid, scaled, "test", "test"),
                }
            )
        return rows
