"""DecNAS (Xu et al., "Federated Neural Architecture Search", Algorithm 4.1).

Start from GM_0 (trained here with FedAvg, or given).  Each iteration t:

1. budget ``R_t = Res(GM_{t-1}) - dR_t`` (:mod:`.netadapt`);
2. K candidates, one per prunable layer, each pruned just enough (largest-norm
   filters kept) to meet R_t (:mod:`..search_spaces.prunable`);
3. the connected clients are regrouped: balanced data sizes, label histograms
   close to the global one (:mod:`.grouping`);
4. rounds (dynamic number): candidates go to free groups, queued in waves when
   there are more candidates than groups; every client of a group trains E
   epochs and reports its validation accuracy only; the server fuses the
   accuracies by validation count and drops the alpha share of the iteration's
   K candidates with the largest ``(Acc(GM_{t-1}) - acc) / (Res(GM_{t-1}) - Res(PM))``
   (never the last); only the survivors' groups then upload their weights,
   fused by training count;
5. GM_t = the best survivor.

Then the chosen GMs get long-term FedAvg tuning (``SeededFedAvg``) and a test.
``settings.variant`` switches optimisations off for the comparisons (see
``DecNASSettings``).

Client contract
---------------
``query.profile``
    As ``NodeProfile``: ``num-train`` and ``label-counts`` feed the grouping.
``query.decnas_latency``
    With ``resource = "latency"``, to the target nodes only: GM_0's layer-wise latency
    table (:mod:`.latency`; the records of ``query.latency``).
``train.decnas_tune``
    arrays: the candidate's ``state_dict``.  config: ``method``, ``seed``,
    ``server-round``, ``iteration``, ``round``, ``candidate``, ``local-epochs``,
    ``batch-size``, ``lr``, ``momentum``, ``weight-decay``, ``net-macs``,
    ``space.<kwarg>`` (the net's ``spec``: name or import path, the model's arguments,
    ``input_shape``, ``widths``; ``load_prunable`` rebuilds it).  Reply:
    **no arrays**; metrics ``num-examples`` (training samples), ``num-val``,
    ``correct``, ``accuracy`` (validation, after training), ``train-loss``,
    ``train-flops``.  The client keeps the trained weights.
``train.decnas_upload``
    config: ``iteration``, ``round``, ``candidate``.  Reply: the kept weights
    (ArrayRecord ``arrays``, every key) and ``num-examples``.
``train.decnas_fedavg``
    As ``train.decnas_tune`` without iteration/round/candidate; reply: the
    trained weights, ``num-examples``, ``train-loss``, ``train-flops``.
``evaluate.decnas``
    arrays and ``space.<kwarg>``; config ``split`` (``val`` or ``test``).
    Reply: metrics ``num-examples``, ``correct``, ``loss``, ``accuracy``.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from logging import INFO, WARNING
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from ...arrays import record_of
from ...checkpoints import Resume
from ...federation.aggregation import opa
from ...federation.base import NodeProfile, StageFailedError, describe_table
from ...federation.replies import (
    ArraySpec,
    array_specs,
    check_latency_reply,
    check_reply,
    content_bytes,
)
from ...latency import LatencyRequest, LatencyTable, group_table, table_document, table_from_records
from ...progress import StageClock
from ...protocol import ARRAYS, CONFIG, LATENCY, METRICS, REPLY_BYTES, space_to_config
from ...search_spaces.prunable import PrunableNet, prune_to_budget
from .grouping import (
    PLAUSIBLE_FACTOR,
    balance_ratio,
    clip_declared,
    group_clients,
    mean_label_distance,
    random_groups,
    schedule_waves,
)
from .latency import layer_layout
from .messages import DECNAS_TUNE, DECNAS_UPLOAD, QUERY_DECNAS_LATENCY
from .netadapt import (
    budget,
    degradation,
    pick_global_model,
    rounds_for,
    survivors_after_drop,
)
from .settings import DecNASSettings
from .stages import FINAL, GM0, ITERATIONS, DecNASResult, GlobalModel, PrunedModelStages

__all__ = ["DecNAS", "DecNASResult", "GlobalModel"]

TUNE_COUNTS = ("num-examples", "num-val", "correct", "train-flops")
Pool = dict[int, tuple[dict[str, Any], ArrayRecord]]  # candidate -> (spec, weights)


def takes_model(evaluate_fn: Callable[..., Any]) -> bool:
    """Whether ``evaluate_fn`` takes a ``model`` keyword (or ``**kwargs``): DecNAS then
    passes GM_t, whose widths the arrays alone do not name."""
    try:
        parameters = inspect.signature(evaluate_fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable without a signature
        return False
    return any(
        p.kind is p.VAR_KEYWORD
        or (p.name == "model" and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))
        for p in parameters
    )


class DecNAS(PrunedModelStages):
    """Federated NetAdapt with client groups, early dropping and dynamic rounds.

    Parameters
    ----------
    net : PrunableNet
        GM_0's structure and initial weights: ``build_prunable(MyNet, input_shape=...,
        **kwargs)`` for any ``nn.Module`` class of conv/linear layers the clients can
        import, or a built-in (``"convnet"``, ``"mobilenet"``).
    settings : DecNASSettings
        Hyper-parameters and the variant (paper values in its docstring).
    seed : int
        Fixes client sampling, scheduling and fresh initialisations.
    validate_profiles : callable, optional
        Called with the node profiles before any training; raise to stop.
    resume : Resume, optional
        A checkpoint: the run continues with the iteration after its last GM_t, or,
        taken when the iterations had ended, with the tuning and tests.
    min_nodes
        See ``FederatedNASStrategy``.

    GM_0's FedAvg rounds, the tuning and the baselines take their parameters from
    ``settings`` (``gm0_rounds``, ``final_rounds``, ``width_baseline``, ...).
    """

    def __init__(
        self,
        *,
        net: PrunableNet,
        settings: DecNASSettings,
        seed: int,
        validate_profiles: Callable[[Sequence[NodeProfile]], None] | None = None,
        resume: Resume | None = None,
        min_nodes: int = 2,
        latency: LatencyRequest | None = None,
    ) -> None:
        super().__init__(
            net=net, settings=settings, seed=seed, min_nodes=min_nodes, latency=latency
        )
        self.resume = resume
        self.validate_profiles = validate_profiles
        self.groups: list[list[NodeProfile]] = []
        #: node id -> the candidate's arrays its current upload asks back (reply_specs)
        self._upload_specs: dict[int, dict[str, ArraySpec]] = {}

    rounds_setting = "max_iterations"

    def summary(self) -> None:
        s = self.settings
        log(
            INFO, "\t├── DecNAS (%s): %s widths %s", s.variant, self.net.name, list(self.net.widths)
        )
        log(
            INFO,
            "\t└── target %.2f of GM_0's %s, %s groups, alpha %.2f, rounds %s",
            s.target,
            s.resource,
            s.num_groups if s.grouping else 1,
            s.drop_ratio if s.dropping else 0.0,
            list(s.rounds) if s.dynamic_rounds else [max(s.rounds)],
        )

    # --- the Strategy hooks: one candidate on one group --------------------------------

    def configure_train(
        self,
        server_round: int,
        arrays: ArrayRecord,
        config: ConfigRecord,
        grid: Grid,
        *,
        nodes: Sequence[NodeProfile] | None = None,
    ) -> Iterable[Message]:
        """Tuning messages: the candidate ``arrays`` and ``config`` to every connected node
        of ``nodes``, the group that tunes it (default: every profiled node)."""
        connected = set(grid.get_node_ids())
        chosen = self.profiles.values() if nodes is None else nodes
        messages = [
            Message(
                RecordDict({ARRAYS: arrays, CONFIG: config}),
                message_type=DECNAS_TUNE,
                dst_node_id=node.node_id,
            )
            for node in chosen
            if node.node_id in connected
        ]
        return self.instruct("train", "tune", server_round, messages)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Model fusion of one survivor's uploads (accepted replies): the mean weighted by
        training count, ``PM + sum(n_s grad_s) / sum(n_s)`` (§4.3). Every upload carries
        every key of the candidate (checked on arrival), so the fusion needs nothing but
        the replies. Error replies are skipped (booked as failures), as Flower's FedAvg
        skips them."""
        replies = self.accept("upload", self.screened("upload", "train", replies), lambda _: None)
        updates = [
            (
                r.content.array_records[ARRAYS],
                int(r.content.metric_records[METRICS]["num-examples"]),
            )
            for r in replies
        ]
        if not updates:
            return None, None
        total = sum(n for _, n in updates)
        fused = opa(updates[0][0], updates, min_contributors=1, aggregation=self.aggregation)
        return fused, MetricRecord({"num-examples": total, "clients": len(updates)})

    def reply_specs(self, instruction: Message) -> Mapping[str, ArraySpec] | None:
        """An upload's reply carries the candidate its node was asked for (its instruction
        carries no arrays); any other reply: ``FederatedNASStrategy.reply_specs``."""
        if instruction.metadata.message_type == DECNAS_UPLOAD:
            return self._upload_specs.get(instruction.metadata.dst_node_id)
        return super().reply_specs(instruction)

    def check_tune_reply(self, reply: Message) -> str | None:
        """Why a tuning reply is unusable: malformed, or counts beyond the node's splits."""
        node_id = reply.metadata.src_node_id
        val = self.claim(node_id, "val")
        return check_reply(
            reply,
            counts=TUNE_COUNTS,
            bounds={"num-examples": self.claim(node_id, "train"), "num-val": val, "correct": val},
        )

    # --- one iteration ---------------------------------------------------------------------

    def regroup(self, grid: Grid, iteration: int) -> dict[str, Any]:
        """Partition the connected clients into ``self.groups`` (one group: grouping off)."""
        nodes = self.connected(grid)
        sizes, labels, cut = clip_declared(
            [p.num_train for p in nodes], [p.label_counts for p in nodes]
        )
        for i in cut:
            log(
                WARNING,
                "Groups of iteration %d: node %d declares num-train = %d, above %g x the "
                "median: grouped as %d",
                iteration,
                nodes[i].node_id,
                nodes[i].num_train,
                PLAUSIBLE_FACTOR,
                sizes[i],
            )
        groups_n = self.settings.num_groups if self.settings.grouping else 1
        indices = group_clients(sizes, labels, groups_n, self.settings.balance_ratio)
        self.groups = [[nodes[i] for i in g] for g in indices]
        rng = self.rng("random-groups", iteration)
        summary = {
            "iteration": iteration,
            "groups": [[nodes[i].partition_id for i in g] for g in indices],
            "data-sizes": [sum(sizes[i] for i in g) for g in indices],
            "balance-ratio": balance_ratio(indices, sizes),
            "label-distance": mean_label_distance(indices, labels),
            "random-label-distance": mean_label_distance(
                random_groups(rng, len(nodes), len(indices)), labels
            ),
        }
        if summary["balance-ratio"] > self.settings.balance_ratio:
            log(
                WARNING,
                "Groups of iteration %d: data-size ratio %.3f exceeds r = %.3f",
                iteration,
                summary["balance-ratio"],
                self.settings.balance_ratio,
            )
        return summary

    def candidates(self, model: GlobalModel, target: float) -> dict[int, PrunableNet]:
        """One pruned candidate per prunable layer that can meet ``target``."""
        net = self.load_net(model.spec, model.arrays)
        found = {}
        for layer in range(net.num_layers):
            pruned = prune_to_budget(
                net,
                layer,
                target,
                self.settings.resource,
                self.settings.min_filters,
                cost=self.latency_cost,
            )
            if pruned is not None and pruned.widths != net.widths:
                found[layer] = pruned
        return found

    def tune(
        self, grid: Grid, iteration: int, round_: int, pool: Pool
    ) -> tuple[dict[int, float], dict[int, list[int]], dict[int, int]]:
        """Every candidate in ``pool`` trained and validated by a group, in waves; returns
        the accuracy fused by validation count, the nodes that reported, and the groups."""
        order = self.rng("schedule", iteration, round_).permutation(len(self.groups))
        accuracy, reported, group_of = {}, {}, {}
        for wave in schedule_waves(sorted(pool), [int(g) for g in order]):
            messages, candidate_of = [], {}
            for candidate, group in wave:
                spec, arrays = pool[candidate]
                group_of[candidate] = group
                config = self.train_config(
                    spec,
                    iteration=iteration,
                    round=round_,
                    candidate=candidate,
                    **{"server-round": iteration * 1000 + round_},
                )
                record = ConfigRecord(config)
                group_nodes = self.groups[group]
                sent = list(self.configure_train(round_, arrays, record, grid, nodes=group_nodes))
                candidate_of.update({m.metadata.dst_node_id: candidate for m in sent})
                messages.extend(sent)
            replies = self.accept(
                "tune",
                self.exchange(grid, "tune", messages),
                self.check_tune_reply,
            )
            self.require("tune", len(replies), len(messages))
            totals: dict[int, list[int]] = {}
            for reply in replies:
                node = reply.metadata.src_node_id
                metrics = reply.content.metric_records[METRICS]
                self.ledger.node("tune", node).train_flops += int(metrics["train-flops"])
                total = totals.setdefault(candidate_of[node], [0, 0])
                total[0] += int(metrics["correct"])
                total[1] += int(metrics["num-val"])
                reported.setdefault(candidate_of[node], []).append(node)
            for candidate, (correct, count) in totals.items():
                accuracy[candidate] = correct / count if count else math.nan
        return accuracy, reported, group_of

    def upload(
        self, grid: Grid, iteration: int, round_: int, pool: Pool, reported: dict[int, list[int]]
    ) -> dict[int, int]:
        """Only the survivors' groups upload their kept weights; each survivor in ``pool``
        becomes their fusion.  Returns the number of uploads per candidate.

        A client that tuned several survivors (queued waves) uploads them in separate
        exchanges, so that every reply is matched to its candidate by its sender.
        """
        batches: list[dict[int, int]] = []  # node -> candidate, each node once per batch
        for candidate in sorted(pool):
            nodes = reported.get(candidate, [])
            if not nodes:  # no usable tuning reply: the candidate keeps its weights
                continue
            batch = next((b for b in batches if not set(nodes) & set(b)), None)
            if batch is None:
                batch = {}
                batches.append(batch)
            batch.update({node: candidate for node in nodes})
        uploads = dict.fromkeys(pool, 0)
        for batch in batches:  # every candidate's nodes are in one batch
            replies: dict[int, list[Message]] = {c: [] for c in sorted(set(batch.values()))}
            for candidate, reply in self._upload_batch(grid, iteration, round_, pool, batch):
                replies[candidate].append(reply)
            for candidate, mine in replies.items():  # screened against this batch's messages
                fused, _ = self.aggregate_train(round_, mine)
                if fused is not None:
                    pool[candidate] = (pool[candidate][0], fused)
                uploads[candidate] = len(mine)
        return uploads

    def _upload_batch(
        self, grid: Grid, iteration: int, round_: int, pool: Pool, candidate_of: dict[int, int]
    ) -> list[tuple[int, Message]]:
        messages = []
        # an upload carries the candidate's weights, which its instruction does not: the
        # reply-size bound allows them (replies.check_reply_size)
        weights = {
            c: content_bytes(RecordDict({ARRAYS: arrays})) for c, (_, arrays) in pool.items()
        }
        for node, candidate in candidate_of.items():
            config = {"method": self.method, "iteration": iteration, "round": round_}
            config["candidate"] = candidate
            config[REPLY_BYTES] = weights[candidate]
            messages.append(
                Message(
                    RecordDict({CONFIG: ConfigRecord(config)}),
                    message_type=DECNAS_UPLOAD,
                    dst_node_id=node,
                )
            )
        messages = self.instruct("train", "upload", round_, messages)
        specs = {c: array_specs(arrays) for c, (_, arrays) in pool.items()}
        self._upload_specs = {node: specs[c] for node, c in candidate_of.items()}

        def check(reply: Message) -> str | None:
            sent = specs[candidate_of[reply.metadata.src_node_id]]
            claim = self.claim(reply.metadata.src_node_id, "train")
            reason = check_reply(reply, sent=sent, bounds={"num-examples": claim})
            if reason is None and len(reply.content.array_records[ARRAYS]) != len(sent):
                return "the upload does not carry every key of the candidate"
            return reason

        replies = self.accept("upload", self.exchange(grid, "upload", messages), check)
        self.require("upload", len(replies), len(messages))
        return [(candidate_of[r.metadata.src_node_id], r) for r in replies]

    def iteration(
        self, grid: Grid, t: int, previous: GlobalModel, initial: GlobalModel
    ) -> tuple[GlobalModel | None, list[dict[str, Any]], dict[str, Any]]:
        """One NetAdapt iteration; ``None`` when no layer can meet the budget."""
        s = self.settings
        res_previous, res_initial = self.resource_of(previous), self.resource_of(initial)
        target = budget(
            res_previous, res_initial, t, s.initial_reduction, s.decay, s.target * res_initial
        )
        group_summary = self.regroup(grid, t)
        nets = self.candidates(previous, target)
        if not nets:
            log(WARNING, "Iteration %d: no layer can be pruned to %.6g", t, target)
            return None, [], group_summary
        pool: Pool = {c: (n.spec, record_of(n.state_dict())) for c, n in nets.items()}
        costs = {c: self.cost_of(n) for c, n in nets.items()}
        rounds = rounds_for(t, s.rounds, s.rounds_every) if s.dynamic_rounds else max(s.rounds)
        alpha = s.drop_ratio if s.dropping else 0.0
        log(
            INFO,
            "Iteration %d: budget %.6g, %d candidates, %d group(s), %d round(s)",
            t,
            target,
            len(pool),
            len(self.groups),
            rounds,
        )
        history, accuracy, ratios = [], {}, {}
        clock = StageClock(f"iteration-{t}", rounds)  # the run's plan: decnas/runner.py
        for round_ in range(1, rounds + 1):
            accuracy, reported, group_of = self.tune(grid, t, round_, pool)
            ratios = {
                c: math.inf
                if math.isnan(accuracy.get(c, math.nan))
                else degradation(previous.val_accuracy, accuracy[c], res_previous, costs[c])
                for c in pool
            }
            kept = survivors_after_drop(ratios, len(nets), alpha)
            dropped = sorted(set(pool) - set(kept))
            for c in dropped:
                del pool[c]
            uploads = self.upload(grid, t, round_, pool, reported)
            history.append(
                {
                    "iteration": t,
                    "round": round_,
                    "budget": target,
                    "accuracy": {str(c): accuracy.get(c) for c in sorted(ratios)},
                    "degradation": {str(c): ratios[c] for c in sorted(ratios)},
                    "resource": {str(c): costs[c] for c in sorted(ratios)},
                    "group-of": {str(c): g for c, g in sorted(group_of.items())},
                    "dropped": dropped,
                    "survivors": sorted(pool),
                    "uploads": {str(c): n for c, n in sorted(uploads.items())},
                }
            )
            shown = {f"candidate-{c}": a for c, a in history[-1]["accuracy"].items()}
            log(INFO, "%s", clock.line(round_, shown, dropped=dropped or "-"))
        best = pick_global_model({c: ratios[c] for c in pool}, accuracy, s.pick)
        spec, arrays = pool[best]
        model = self.global_model(
            self.load_net(spec, arrays),
            t,
            accuracy.get(best, math.nan),
            pruned_layer=best,
            budget=target,
        )
        return model, history, group_summary

    # --- the whole method ------------------------------------------------------------------

    def run(self, grid: Grid, initial_arrays: ArrayRecord) -> DecNASResult:
        """GM_0 (FedAvg), NetAdapt iterations down to the target, tuning, test, baselines.

        Flower's parameters: ``initial_arrays`` are GM_0's initial weights (an empty
        ``ArrayRecord``: the net's own); ``num_rounds`` is the most NetAdapt iterations
        (``settings.max_iterations`` is replaced by it; the search stops earlier at the
        target); ``timeout`` the reply timeout of every step; ``train_config`` /
        ``evaluate_config`` travel in every ``train.*`` / ``evaluate.*`` message;
        ``evaluate_fn(t, arrays)`` is called with GM_0 (t = 0) and each new GM_t's
        weights (their widths shrink with t); a function that takes a ``model`` keyword,
        ``evaluate_fn(t, arrays, model)``, also gets GM_t itself (a ``GlobalModel``: its
        ``spec``, ``widths``, ``macs``; ``model.net()`` is the pruned net holding
        ``arrays``). The constructor's ``resume`` continues a checkpointed run."""
        resume = self.resume
        s = self.settings
        log(INFO, "Starting DecNAS")
        self.summary()
        if resume is not None:
            self.ledger.restore(resume.ledger)
        with self.ledger.timed("setup"):
            self.profile_nodes(grid, ConfigRecord({"method": self.method}))
        if s.resource == "latency":
            with self.ledger.timed("latency"):
                self.measure_targets(grid)
        searching = True
        if resume is not None:
            frontier, groups = self.restore_frontier(resume)
            history = [dict(h) for h in resume.history]
            searching = not resume.past(ITERATIONS)
            log(INFO, "DecNAS resumed after GM_%d (%s)", len(frontier) - 1, resume.path)
        else:
            self.reached(GM0, 0)
            if not len(initial_arrays):
                initial_arrays = record_of(self.net.state_dict())
            arrays = self.fedavg(grid, self.net.spec, initial_arrays, s.train.rounds, GM0)
            gm0 = self.global_model(self.load_net(self.net.spec, arrays), 0, math.nan)
            gm0.val_accuracy = self.evaluate(grid, gm0, "val", "evaluate")
            self._record_iteration(gm0)
            frontier, history, groups = [gm0], [], []
            self._reached_frontier(GM0, s.train.rounds, frontier, history, groups, done=True)
        gm0 = frontier[0]
        self.reached(ITERATIONS, len(frontier) - 1)
        for t in range(len(frontier), s.max_iterations + 1 if searching else 0):
            if self.resource_of(frontier[-1]) <= s.target * self.resource_of(gm0):
                break
            model, entries, summary = self.iteration(grid, t, frontier[-1], gm0)
            history.extend(entries)
            groups.append(summary)
            if model is None:
                break
            frontier.append(model)
            self._record_iteration(model)
            self._reached_frontier(ITERATIONS, t, frontier, history, groups)
        self._reached_frontier(ITERATIONS, len(frontier) - 1, frontier, history, groups, done=True)
        self.reached(FINAL, 0)
        self.finish(grid, frontier)
        self.reached(FINAL, s.final_rounds, stage_done=True)  # result.json's status
        baseline = self.width_baseline(grid, frontier) if s.width_baseline else []
        result = DecNASResult(
            frontier=frontier,
            history=history,
            groups=groups,
            ledger=self.ledger.summary(),
            width_baseline=baseline,
            latency=self.latency_summary(),
        )
        # the model to deploy: GM_T as tuned (where tuning ran), the searched one beside it
        final = frontier[-1]
        deployed = final.arrays if final.tuned_arrays is None else final.tuned_arrays
        self.contract_result(result, deployed)
        result.untuned_arrays = final.arrays
        return result

    # --- latency as the resource (NetAdapt's) -------------------------------------------

    def target_nodes(self, grid: Grid) -> list[NodeProfile]:
        """The connected nodes of the target device class (``decnas.latency-devices``;
        "": every node), by partition id."""
        name = self.settings.latency_devices
        return [p for p in self.connected(grid) if not name or p.device_class == name]

    def measure_targets(self, grid: Grid) -> LatencyTable:
        """Ask the target nodes only for their layer-wise table of GM_0
        (``query.decnas_latency``); drop malformed replies naming the node; the per-entry
        median of the kept tables is the table every budget and candidate is costed on.

        Raises
        ------
        StageFailedError
            No target node is connected, or none answered with a usable table.
        """
        name = self.settings.latency_devices
        what = (
            f"device class {name!r} (run config 'decnas.latency-devices')"
            if name
            else "any device class (run config 'decnas.latency-devices' = \"\")"
        )
        targets = self.target_nodes(grid)
        if not targets:
            present = sorted({p.device_class for p in self.connected(grid)})
            raise StageFailedError(
                f"DecNAS by latency: no connected node of {what}; the nodes' node config "
                f"'device-class' values: {present}"
            )
        layout = layer_layout(self.net.spec, self.settings.latency_grid)
        request = self.latency_request or LatencyRequest(seed=self.seed)
        config = ConfigRecord({**request.to_config(), **space_to_config(layout.spec)})
        messages = [
            Message(
                RecordDict({CONFIG: config}),
                message_type=QUERY_DECNAS_LATENCY,
                dst_node_id=p.node_id,
            )
            for p in targets
        ]
        tables: dict[int, LatencyTable] = {}
        for reply in self.exchange(grid, "latency", messages):
            node_id = reply.metadata.src_node_id
            reason = check_latency_reply(reply, layout.num_options())
            if reason is None:
                try:
                    tables[node_id] = table_from_records(
                        reply.content.metric_records[METRICS],
                        reply.content.config_records[LATENCY],
                        layout.spec,
                        layout.num_options(),
                    )
                except (KeyError, TypeError, ValueError) as exc:
                    reason = f"malformed latency table: {exc!r}"
            if reason is not None:
                self._drop("latency", node_id, reason)
                continue
            log(INFO, "[latency] node %d: %s", node_id, describe_table(tables[node_id]))
        try:
            self.require("latency", len(tables), len(messages), at_most_sent=True)
        except StageFailedError as exc:
            raise StageFailedError(f"DecNAS by latency, target nodes of {what}: {exc}") from exc
        self.layer_layout, self.target_tables = layout, tables
        self.layer_table = group_table([tables[n] for n in sorted(tables)])
        log(
            INFO,
            "DecNAS by latency: %d target node(s) of %s, %d units; GM_0 %.4g ms",
            len(tables),
            what,
            len(layout.units),
            self.latency_cost(self.net.widths),
        )
        return self.layer_table

    def latency_summary(self) -> dict[str, Any]:
        """``result.json``'s ``latency``: the target class, the units and the target
        devices' table (the per-entry median); empty unless the resource is latency."""
        if self.layer_table is None or self.layer_layout is None:
            return {}
        layout = self.layer_layout
        return {
            "device-class": self.settings.latency_devices,
            "target-nodes": sorted(self.profiles[n].partition_id for n in self.target_tables),
            "grid-points": layout.points,
            "grids": [list(g) for g in layout.grids],
            "units": [{"name": u.name, "deps": list(u.deps)} for u in layout.units],
            "table": table_document(self.layer_table),
        }

    def _record_iteration(self, model: GlobalModel) -> None:
        """GM_t's numbers as the iteration's training metrics; ``evaluate_fn`` on GM_t."""
        metrics = {"macs": model.macs, "params": model.params}
        if model.latency_ms is not None:
            metrics["latency-ms"] = model.latency_ms
        if not math.isnan(model.val_accuracy):
            metrics["val-accuracy"] = model.val_accuracy
        self.train_metrics[model.iteration] = MetricRecord(metrics)
        if self.evaluate_fn is not None:
            with self.ledger.timed("evaluate"):
                if takes_model(self.evaluate_fn):
                    evaluated = self.evaluate_fn(model.iteration, model.arrays, model=model)
                else:
                    evaluated = self.evaluate_fn(model.iteration, model.arrays)
            if evaluated is not None:
                self.server_metrics[model.iteration] = evaluated
