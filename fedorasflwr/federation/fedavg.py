"""Flower's FedAvg for this project's training stages (fine-tuning, final training).

Three things differ from ``flwr.serverapp.strategy.FedAvg``, and only these:

- **sampling** is seeded and restricted to eligible nodes (e.g. a tier and the tiers
  above it, or one cluster), ordered by partition id, so the same seed picks the
  same clients whatever node ids the engine hands out;
- **message types** are configurable (``"train.<action>"``), so one ClientApp can
  serve several methods' training stages;
- **bad replies are dropped, not fatal**: Flower's FedAvg raises on a reply whose
  keys differ from the others; here an error, a timeout, a malformed or
  non-finite reply is logged with the node id and the reason, counted in the
  ledger, and left out.  Fewer than ``min_replies`` usable replies stop the stage.
  So is a second reply of a node, one of another message type, one that does not
  echo its instruction's nonce (``fedorasflwr.nonce``: a stale reply), one from a
  node not addressed, and one whose ``num-examples`` exceeds the node's declared
  training (train) or test (evaluate) split; the usable ones are aggregated in
  partition-id order, never in arrival order;
- **aggregation** can be robust (``aggregation``: coordinate-wise median or
  trimmed mean instead of the example-weighted mean, see ``aggregation.py``).

Everything else (weighting by ``num-examples``, metric averaging, ``start()``) is
Flower's own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result
from flwr.supercore import log

from ..arrays import to_array, view_of
from ..costs import array_record_bytes
from ..ledger import Ledger, failure_kind
from ..nonce import stamp
from ..progress import StageClock, quiet_flower_strategy
from ..seeding import numpy_stream
from .aggregation import MEAN, Aggregation, opa
from .base import (
    NodeProfile,
    StageFailedError,
    answered_node,
    destinations,
    sample_nodes,
)
from .polling import prompt
from .replies import (
    ArraySpec,
    array_specs,
    check_reply,
    check_whole,
    error_reason,
    screen_replies,
)
from .wire import packing, unpack_replies

__all__ = ["SeededFedAvg", "TrainedRounds", "cosine_lr", "step_lr", "trained_rounds"]


class SeededFedAvg(FedAvg):
    """FedAvg over ``nodes`` with seeded sampling, custom message types and reply checks.

    Parameters
    ----------
    nodes : sequence of NodeProfile
        The eligible nodes (those not connected at sampling time are skipped).
    seed : int
        Fixes which nodes each round samples.
    stage : str
        Name under which the ledger counts this stage's messages.
    ledger : Ledger
        Where bytes, failures and rejections are counted.
    clients_per_round : int
        Nodes sampled per round (all eligible ones if fewer).
    min_replies : int (default: 1)
        Fewest usable replies a round may end with.
    train_message_type, evaluate_message_type : str
        Message types of the training and evaluation messages.
    round_config : callable, optional
        ``server_round -> mapping`` merged into each round's training config
        (e.g. a learning-rate schedule, see ``cosine_lr``).
    aggregation : Aggregation (default: the example-weighted mean, Flower's own)
        How the replies' arrays are combined (robust: median / trimmed mean).
    round_lines_every : float (default: 0)
        0: a line per round and one naming the job. Otherwise a line at most every that
        many seconds and none for the last round nor the job: the caller words the job in
        one line when it ends (many short jobs, e.g. FedorAS's fine-tuning, stay readable).
    train_counts : sequence of str (default: none)
        Metrics every training reply must carry as whole, non-negative numbers (e.g.
        ``"train-flops"``, booked in the ledger); a reply without one is dropped.
    **kwargs
        Passed to ``FedAvg`` (``weighted_by_key``, ``arrayrecord_key``, metric
        aggregation functions ...).  ``fraction_evaluate=0`` skips client evaluation.
    """

    def __init__(
        self,
        *,
        nodes: Sequence[NodeProfile],
        seed: int,
        stage: str,
        ledger: Ledger,
        clients_per_round: int,
        min_replies: int = 1,
        train_message_type: str = MessageType.TRAIN,
        evaluate_message_type: str = MessageType.EVALUATE,
        round_config: Callable[[int], Mapping[str, Any]] | None = None,
        aggregation: Aggregation = MEAN,
        round_lines_every: float = 0.0,
        train_counts: Sequence[str] = (),
        **kwargs: object,
    ) -> None:
        kwargs.setdefault("min_available_nodes", 1)
        with quiet_flower_strategy():  # no "fraction_evaluate is set to 0.0" per job
            super().__init__(min_train_nodes=min_replies, **kwargs)  # type: ignore[arg-type]
        if not nodes:
            raise ValueError(f"[{stage}] no eligible node to train on")
        self.nodes = list(nodes)
        self.seed = seed
        self.stage = stage
        self.ledger = ledger
        self.clients_per_round = clients_per_round
        self.min_replies = min_replies
        self.train_message_type = train_message_type
        self.evaluate_message_type = evaluate_message_type
        self.round_config = round_config
        self.aggregation = aggregation
        self.round_lines_every = round_lines_every
        self.train_counts = tuple(train_counts)
        self._profiles = {p.node_id: p for p in self.nodes}
        self._sent_specs: dict[str, ArraySpec] = {}
        self._expected: set[int] = set()
        self._sent: list[Message] = []
        self._clock: StageClock | None = None
        self._train_metrics: MetricRecord | None = None

    # --- what a person sees: one line per job and per round, not Flower's banner ----

    def summary(self) -> None:
        if self.round_lines_every > 0:
            return
        log(
            INFO,
            "[%s] FedAvg: %d of %d eligible node(s) per round",
            self.stage,
            min(self.clients_per_round, len(self.nodes)),
            len(self.nodes),
        )

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """Flower's ``start``, logging one line per round (train and server metrics, ETA)
        instead of its banner and per-round blocks (all back with ``--verbose``)."""
        self._clock = StageClock(self.stage, num_rounds)

        def evaluate_and_log(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            metrics = evaluate_fn(server_round, arrays) if evaluate_fn is not None else None
            if self._clock is not None and self._clock.due(server_round, self.round_lines_every):
                shown = {
                    k: v
                    for k, v in {**dict(self._train_metrics or {}), **dict(metrics or {})}.items()
                    if "flops" not in k and "examples" not in k
                }
                log(INFO, "%s", self._clock.line(server_round, shown))
            return metrics

        with quiet_flower_strategy():
            return super().start(
                packing(prompt(grid), self._reads_packed),
                initial_arrays,
                num_rounds=num_rounds,
                timeout=timeout,
                train_config=train_config,
                evaluate_config=evaluate_config,
                evaluate_fn=evaluate_and_log,
            )

    def _reads_packed(self, node_id: int) -> bool:
        profile = self._profiles.get(node_id)
        return profile is not None and profile.reads_packed

    def _sample(self, grid: Grid, server_round: int, purpose: str) -> list[int]:
        connected = set(grid.get_node_ids())
        candidates = [p for p in self.nodes if p.node_id in connected]
        rng = numpy_stream(self.seed, self.stage, purpose, server_round)
        return [p.node_id for p in sample_nodes(rng, candidates, self.clients_per_round)]

    def _messages(
        self, grid: Grid, server_round: int, record: RecordDict, message_type: str, purpose: str
    ) -> list[Message]:
        node_ids = self._sample(grid, server_round, purpose)
        self._expected = set(node_ids)
        arrays = record.array_records.get(self.arrayrecord_key)
        nbytes = array_record_bytes(arrays) if arrays is not None else 0
        for node_id in node_ids:
            self.ledger.sent(self.stage, node_id, nbytes)
        messages = self._construct_messages(record, node_ids, message_type)
        self._sent = [stamp(m, self.stage, server_round) for m in messages]
        return list(self._sent)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Seeded sample of eligible nodes; the model and config go to each."""
        config["server-round"] = server_round
        if self.round_config is not None:
            for key, value in self.round_config(server_round).items():
                config[key] = value
        self._sent_specs = array_specs(arrays)
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        return self._messages(grid, server_round, record, self.train_message_type, "train")

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        if self.fraction_evaluate == 0.0:
            return []
        config["server-round"] = server_round
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        return self._messages(grid, server_round, record, self.evaluate_message_type, "evaluate")

    def _usable(self, replies: Iterable[Message], with_arrays: bool) -> list[Message]:
        """Replies fit for Flower's aggregation; the rest are logged, counted and dropped."""
        usable: list[Message] = []
        metric_keys: set[str] | None = None
        sent_to = destinations(self._sent)  # ids are set once the grid pushed them
        # sizes, then each packed index against what was sent, before a byte is decoded
        replies, malformed = unpack_replies(replies, self._sent)
        for node_id, reason in malformed:
            self.ledger.rejected(self.stage, node_id)
            log(WARNING, "[%s] dropped reply of node %d: %s", self.stage, node_id, reason)
        kept, refused = self._one_reply_per_node(replies)
        # booked once, as rejected, not also as timed out
        self._expected -= refused | {node_id for node_id, _ in malformed}
        for reply in kept:
            node_id = answered_node(reply, sent_to)
            if node_id is None:
                log(WARNING, "[%s] ignored a reply to no message of this round", self.stage)
                continue
            self._expected.discard(node_id)
            if reply.has_error():
                self.ledger.failed(self.stage, node_id, failure_kind(reply))
                log(WARNING, "[%s] node %d failed: %s", self.stage, node_id, error_reason(reply))
                continue
            arrays = reply.content.array_records.get(self.arrayrecord_key)
            self.ledger.received(self.stage, node_id, array_record_bytes(arrays) if arrays else 0)
            reason = self._reason(reply, with_arrays, metric_keys)
            if reason is not None:
                self.ledger.rejected(self.stage, node_id)
                log(WARNING, "[%s] dropped reply of node %d: %s", self.stage, node_id, reason)
                continue
            metrics = reply.content.metric_records["metrics"]
            self.ledger.node(self.stage, node_id).train_flops += int(metrics.get("train-flops", 0))
            metric_keys = set(metrics.keys())
            usable.append(reply)
        for node_id in sorted(self._expected):
            self.ledger.failed(self.stage, node_id, "timeout")
            log(WARNING, "[%s] node %d did not reply in time", self.stage, node_id)
        self._expected = set()
        return usable

    def _one_reply_per_node(self, replies: Iterable[Message]) -> tuple[list[Message], set[int]]:
        """``screen_replies`` against the messages of this round (type, nonce, one per
        node), the kept ones in partition-id order (Flower's weighted sums then do not
        depend on which node answered first); the rest dropped and logged. Also returns
        the addressed nodes that had a reply refused."""
        kept, refused = screen_replies(self._sent, replies)
        for node_id, reason in refused:
            self.ledger.rejected(self.stage, node_id)
            log(WARNING, "[%s] dropped reply of node %d: %s", self.stage, node_id, reason)
        addressed = {m.metadata.dst_node_id for m in self._sent}

        def partition(reply: Message) -> float:
            profile = self._profiles.get(reply.metadata.src_node_id)
            return math.inf if profile is None else profile.partition_id

        return sorted(kept, key=partition), {n for n, _ in refused if n in addressed}

    def _reason(
        self, reply: Message, with_arrays: bool, metric_keys: set[str] | None
    ) -> str | None:
        profile = self._profiles.get(reply.metadata.src_node_id)
        if profile is None:
            return "reply from a node that is not eligible"
        claim = profile.bound("train" if with_arrays else "test")
        reason = check_reply(
            reply,
            sent=self._sent_specs if with_arrays else None,
            counts=(self.weighted_by_key, *(self.train_counts if with_arrays else ())),
            bounds={self.weighted_by_key: claim},
        )
        if reason is None and with_arrays:
            reason = check_whole(reply.content.metric_records["metrics"], self.train_counts)
        if reason is not None:
            return reason
        metrics = reply.content.metric_records["metrics"]
        if metrics[self.weighted_by_key] <= 0:
            return f"metric {self.weighted_by_key!r} is not positive"
        if metric_keys is not None and set(metrics.keys()) != metric_keys:
            return "metric keys differ from the other replies'"
        if with_arrays:
            keys = set(reply.content.array_records[self.arrayrecord_key].keys())
            if keys != set(self._sent_specs):
                return f"returned {len(keys)} arrays for the {len(self._sent_specs)} sent"
        return None

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Flower's FedAvg over the usable replies only (or, robust, the median /
        trimmed mean of each key with Flower's FedAvg metrics)."""
        usable = self._usable(replies, with_arrays=True)
        if len(usable) < self.min_replies:
            raise StageFailedError(
                f"[{self.stage}] round {server_round}: {len(usable)} usable repl"
                f"{'y' if len(usable) == 1 else 'ies'}, at least {self.min_replies} required"
            )
        arrays, metrics = super().aggregate_train(server_round, usable)
        self._train_metrics = metrics
        if arrays is not None and self.aggregation.robust:
            arrays = self._robust(usable)
        return (self._restore_dtypes(arrays) if arrays is not None else None), metrics

    def _robust(self, usable: Sequence[Message]) -> ArrayRecord:
        """The robust aggregate of ``usable`` (each carries every key sent, checked)."""
        updates = [
            (
                r.content.array_records[self.arrayrecord_key],
                int(r.content.metric_records["metrics"][self.weighted_by_key]),
            )
            for r in usable
        ]
        return opa(updates[0][0], updates, min_contributors=1, aggregation=self.aggregation)

    def _restore_dtypes(self, arrays: ArrayRecord) -> ArrayRecord:
        """Flower's FedAvg returns integer buffers (e.g. BN's ``num_batches_tracked``) as
        floats; give every array back the dtype it was sent with (integers rounded)."""
        restored = ArrayRecord()
        for key, array in arrays.items():
            values = view_of(array)
            dtype = np.dtype(self._sent_specs[key].dtype)
            if values.dtype != dtype:
                values = np.rint(values) if np.issubdtype(dtype, np.integer) else values
                array = to_array(np.asarray(values, dtype=dtype))
            restored[key] = array
        return restored

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        usable = self._usable(replies, with_arrays=False)
        return super().aggregate_evaluate(server_round, usable) if usable else None


def cosine_lr(lr: float, final_lr: float, server_round: int, num_rounds: int) -> float:
    """Cosine annealing from ``lr`` (round 1) towards ``final_lr`` (after the last round)."""
    progress = (server_round - 1) / max(num_rounds, 1)
    return final_lr + 0.5 * (lr - final_lr) * (1.0 + math.cos(math.pi * progress))


#: where ``step_lr`` divides the lr by 10: fractions of the rounds (FedorAS, Table 10)
STEP_MILESTONES = (0.5, 0.75)


def step_lr(lr: float, server_round: int, num_rounds: int, factor: float = 0.1) -> float:
    """``lr`` times ``factor`` for every milestone (``STEP_MILESTONES`` of ``num_rounds``,
    rounded) that round ``server_round`` (from 1) is past: FedorAS's Shakespeare schedule,
    10x down at rounds 50 and 75 of 100 (250 and 375 of 500), as PyTorch's ``MultiStepLR``
    with those milestones counts rounds from 0."""
    passed = sum(server_round - 1 >= round(m * num_rounds) for m in STEP_MILESTONES)
    return lr * factor**passed


@dataclass
class TrainedRounds:
    """What a ``SeededFedAvg`` stage that trains and tests one net leaves: its arrays, one
    history entry per round (the train metrics, the test metrics as ``test-<name>``) and
    the last evaluated round's accuracy (None when no round was evaluated or it is not
    finite)."""

    arrays: ArrayRecord
    history: list[dict[str, Any]]
    test_accuracy: float | None


def trained_rounds(outcome: Result, num_rounds: int) -> TrainedRounds:
    """``TrainedRounds`` of a finished ``SeededFedAvg.start`` of ``num_rounds`` rounds."""
    evaluated = outcome.evaluate_metrics_clientapp
    history = [
        {
            "round": r,
            **dict(outcome.train_metrics_clientapp.get(r, {})),
            **{f"test-{k}": v for k, v in dict(evaluated.get(r, {})).items()},
        }
        for r in range(1, num_rounds + 1)
    ]
    accuracy = dict(evaluated[max(evaluated)]).get("accuracy") if evaluated else None
    finite = accuracy is not None and math.isfinite(accuracy)
    return TrainedRounds(outcome.arrays, history, float(accuracy) if finite else None)
