"""Plumbing every federated-NAS strategy shares.

- node profiles (``query.profile``): partition id, data sizes, label
  histogram and declared capabilities of every connected node;
- seeded node sampling, ordered by partition id so that the same seed picks
  the same clients whatever node ids the engine hands out;
- one ``exchange`` that sends messages, counts bytes in the ledger, waits,
  and sorts replies into accepted / failed / missing / rejected, logging each
  dropped reply with the node id and the reason (one reply per addressed node,
  of the type sent, echoing its instruction's nonce: ``one_reply_per_node``); one
  node per partition id;
- every step's instructions carry a nonce (``instruct``), and every public
  ``aggregate_*`` screens its replies against what its ``configure_*`` sent
  (``screened``) before anything else, whoever calls it; accepted replies are
  taken in partition-id order (``in_order``), so float sums do not depend on
  which node answered first;
- what each node can honestly count (``NodeProfile.bound``, ``claim``), for the
  reply checks, and the run's choice of ``aggregation`` (mean or robust);
- the minimum-replies rule: a step with too few good replies raises
  ``StageFailedError`` with the numbers;
- what Flower's ``Strategy.start`` hands over (``begin``): the reply timeout, the
  caller's ``train_config`` / ``evaluate_config`` (merged under every ``train.*`` /
  ``evaluate.*`` message's own config) and ``evaluate_fn``, and the records a
  ``flwr.serverapp.strategy.Result`` carries (``contract_result``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from logging import DEBUG, INFO, WARNING
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from flwr.supercore import log

from ..checkpoints import Snapshot
from ..costs import array_record_bytes
from ..latency import LatencyRequest, LatencyTable, table_from_records
from ..ledger import FailureKind, Ledger, failure_kind
from ..nonce import nonce_of, stamp
from ..packing import VERSION as PACKING_VERSION
from ..packing import packing_versions
from ..progress import format_metrics, nodes_profiled
from ..protocol import (
    ARRAYS,
    CONFIG,
    LATENCY,
    METRICS,
    PROFILE,
    QUERY_LATENCY,
    QUERY_PROFILE,
    SAMPLE_KINDS,
    sample_kind,
    space_to_config,
)
from ..search_spaces.base import SearchSpace
from ..seeding import numpy_stream, stable_hash
from .aggregation import MEAN, Aggregation
from .polling import prompt
from .replies import (
    ArraySpec,
    Bound,
    check_latency_reply,
    error_reason,
    reply_specs,
    screen_replies,
)
from .wire import packing, unpack_replies

__all__ = [
    "FederatedNASStrategy",
    "answered_node",
    "destinations",
    "NodeProfile",
    "ProfileRules",
    "StageFailedError",
    "sample_nodes",
    "stable_hash",
]


_KIND_TEXT: dict[FailureKind, str] = {
    "lost": "lost",
    "timeout": "timed out",
    "error": "failed",
}


def destinations(messages: Iterable[Message]) -> dict[str, int]:
    """Message id -> destination node of sent ``messages``.

    Flower's grids give a message its id when pushing it, so call this after
    ``send_and_receive``; a grid that assigns no ids (the in-process one) gives ``{}``.
    """
    return {
        m.metadata.message_id: m.metadata.dst_node_id for m in messages if m.metadata.message_id
    }


def answered_node(reply: Message, sent_to: dict[str, int]) -> int | None:
    """The node whose message ``reply`` answers, or None if it answers none of ``sent_to``.

    Matched by ``reply_to_message_id``, not by ``src_node_id``: for a lost node or an
    expired message, Flower 1.41's SuperLink builds the error reply itself, with its
    own id (``SUPERLINK_NODE_ID``) as the source.  Without message ids (``sent_to``
    empty) the reply's source is all there is.
    """
    if not sent_to:
        return reply.metadata.src_node_id
    return sent_to.get(reply.metadata.reply_to_message_id)


class StageFailedError(RuntimeError):
    """A step of a strategy ended with fewer good replies than required."""


@dataclass(frozen=True)
class NodeProfile:
    """What a node tells about itself (never its data)."""

    node_id: int
    partition_id: int
    num_partitions: int
    num_train: int
    num_val: int
    num_test: int
    label_counts: tuple[int, ...]
    tier: int = -1
    cluster: int = -1
    # Node config ``device-class`` (a name for the kind of device, e.g. "phone") and
    # ``latency-budget-ms`` (the most milliseconds a model may take on it; 0: none declared).
    device_class: str = ""
    latency_budget_ms: float = 0.0
    # One training sample's shape (no batch dimension) and dtype kind (``SAMPLE_KINDS``);
    # None / "": not declared (a client older than these fields).
    sample_shape: tuple[int, ...] | None = None
    sample_dtype: str = ""
    # The versions of packed messages its ClientApp reads (``fedorasflwr.packing``);
    # (): plain records only (a ClientApp without the mod ``packed_messages``).
    packing: tuple[int, ...] = ()

    @property
    def reads_packed(self) -> bool:
        """Whether instructions to this node travel packed (``packing.VERSION``)."""
        return PACKING_VERSION in self.packing

    @classmethod
    def from_reply(cls, message: Message) -> NodeProfile:
        """The profile a ``query.profile`` reply declares; ``ValueError`` naming the field
        when a count or id is not an integer >= 0 (``label-counts``: a list of them)."""
        record = message.content.config_records[PROFILE]
        budget = float(record.get("latency-budget-ms", 0.0))
        if not math.isfinite(budget) or budget < 0:
            raise ValueError(f"latency-budget-ms = {budget!r} is not a finite number >= 0")
        labels = record["label-counts"]
        if not isinstance(labels, list):
            raise ValueError(f"label-counts = {labels!r} is not a list of integers >= 0")
        shape = record.get("sample-shape")
        if shape is not None and not isinstance(shape, list):
            raise ValueError(f"sample-shape = {shape!r} is not a list of integers >= 0")
        kind = str(record.get("sample-dtype", ""))
        if kind and kind not in SAMPLE_KINDS:
            raise ValueError(f"sample-dtype = {kind!r} is not one of {', '.join(SAMPLE_KINDS)}")
        return cls(
            node_id=message.metadata.src_node_id,
            partition_id=_count("partition-id", record["partition-id"]),
            num_partitions=_count("num-partitions", record["num-partitions"]),
            num_train=_count("num-train", record["num-train"]),
            num_val=_count("num-val", record["num-val"]),
            num_test=_count("num-test", record["num-test"]),
            label_counts=tuple(_count("label-counts", v) for v in labels),
            tier=_label("tier", record.get("tier", -1)),
            cluster=_label("cluster", record.get("cluster", -1)),
            device_class=str(record.get("device-class", "")),
            latency_budget_ms=budget,
            sample_shape=None if shape is None else tuple(_count("sample-shape", v) for v in shape),
            sample_dtype=kind,
            packing=packing_versions(record),
        )

    def bound(self, *splits: str, epochs: int = 1, per_sample: int = 1) -> Bound:
        """The most examples this node can honestly count over ``epochs`` passes of
        ``splits`` ("train", "val", "test"), as declared in its profile; ``per_sample``
        predictions count per sample (a text window of L characters: L)."""
        sizes = {"train": self.num_train, "val": self.num_val, "test": self.num_test}
        limit = sum(sizes[s] for s in splits) * epochs * per_sample
        basis = " + ".join(f"num-{s} {sizes[s]}" for s in splits)
        if epochs != 1:
            basis = f"({basis}) x {epochs} epoch(s)"
        if per_sample != 1:
            basis = f"({basis}) x {per_sample} predictions per sample"
        return Bound(limit, f"node declared {basis}")


def _label(key: str, value: Any) -> int:
    """``value`` of profile field ``key`` (a declared tier or cluster) when it is an integer
    >= -1 (-1: none declared), else ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise ValueError(f"{key} = {value!r} is not an integer >= -1")
    return value


def _count(key: str, value: Any) -> int:
    """``value`` of profile field ``key`` when it is an integer >= 0, else ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{key} = {value!r} is not an integer >= 0")
    return value


@dataclass(frozen=True)
class ProfileRules:
    """What every profile must satisfy to be kept, on arrival (docs/protocol.md, "Profiles").

    Always: every count and id an integer >= 0, ``num-train`` >= 1 (every method trains on
    it), the ``num-partitions`` most nodes declare (a node declaring another is dropped),
    and, when that is > 0, ``partition-id`` below it.

    Attributes
    ----------
    num_classes : int or None
        The length ``label-counts`` must have (the run's class count; text: the vocabulary);
        None: not known, any length (with ``same_length``: the length most nodes declare).
    targets_per_sample : int
        ``sum(label-counts) == num-train x targets_per_sample``: 1 for a class per sample, a
        text window's length for next-token text (a target per position); 0: not checked.
    min_val : int
        Fewest validation samples a node must have (DP-FNAS: 1).
    same_length : bool
        Every kept node's ``label-counts`` has one length (DecNAS's grouping adds them).
    input_shape : tuple of int or None
        The shape ``sample-shape`` must be (the model's ``input_shape``); None: any.
    input_kind : str or None
        The kind ``sample-dtype`` must be (``protocol.sample_kind`` of the model's
        ``input_dtype``); None: any.  A profile declaring neither field (a client older
        than them) is not checked against these two.
    """

    num_classes: int | None = None
    targets_per_sample: int = 1
    min_val: int = 0
    same_length: bool = False
    input_shape: tuple[int, ...] | None = None
    input_kind: str | None = None

    @classmethod
    def of_spec(cls, spec: Mapping[str, Any], **options: Any) -> ProfileRules:
        """The rules a model ``spec`` implies: its ``num_classes`` (or ``vocab_size``) and,
        for text, ``seq_len`` targets per sample."""
        classes = spec.get("num_classes", spec.get("vocab_size"))
        return cls(
            num_classes=None if classes is None else int(classes),
            targets_per_sample=int(spec.get("seq_len", 1)),
            **options,
        )

    @classmethod
    def of_model(cls, model: Any, **options: Any) -> ProfileRules:
        """``of_spec(model.spec)`` and the model's input: one sample's ``input_shape`` and
        the kind of its ``input_dtype`` (a model without one, e.g. a ``PrunableNet``: float)."""
        dtype = getattr(model, "input_dtype", torch.float32)
        return cls.of_spec(
            model.spec,
            input_shape=tuple(int(d) for d in model.input_shape),
            input_kind=sample_kind(dtype),
            **options,
        )

    def declares_sample(self, profile: NodeProfile) -> bool:
        """Whether ``profile`` declares what these rules check of a sample (always true
        when they check nothing of it)."""
        if self.input_shape is None and self.input_kind is None:
            return True
        return profile.sample_shape is not None and bool(profile.sample_dtype)

    def problem(self, profile: NodeProfile, num_partitions: int | None) -> str | None:
        """Why ``profile`` is refused (naming the field and what is allowed), or None."""
        if profile.num_train < 1:
            return f"num-train = {profile.num_train}: a node needs training data (>= 1)"
        if profile.num_val < self.min_val:
            return f"num-val = {profile.num_val}: this method needs >= {self.min_val}"
        if num_partitions is not None and profile.num_partitions != num_partitions:
            return (
                f"num-partitions = {profile.num_partitions}: the other nodes declare "
                f"{num_partitions}"
            )
        if profile.num_partitions > 0 and profile.partition_id >= profile.num_partitions:
            return (
                f"partition-id = {profile.partition_id}: must be in "
                f"[0, num-partitions = {profile.num_partitions})"
            )
        sample = self._sample_problem(profile)
        if sample is not None:
            return sample
        length = len(profile.label_counts)
        if self.num_classes is not None and length != self.num_classes:
            return (
                f"label-counts has {length} entries: the run's task has {self.num_classes} classes"
            )
        if self.targets_per_sample:
            expected = profile.num_train * self.targets_per_sample
            total = sum(profile.label_counts)
            if total != expected:
                per = "" if self.targets_per_sample == 1 else f" x {self.targets_per_sample}"
                return (
                    f"label-counts sum to {total}: num-train = {profile.num_train}{per} "
                    f"makes {expected}"
                )
        return None

    def _sample_problem(self, profile: NodeProfile) -> str | None:
        shape, expected = profile.sample_shape, self.input_shape
        if shape is not None and expected is not None and shape != expected:
            hint = ""
            if len(shape) == 3 and shape == (*expected[1:], expected[0]):
                hint = ": channels last, the model takes channels first (C, H, W)"
            return (
                f"sample-shape = {list(shape)}: the model expects samples of shape "
                f"{list(expected)}{hint}"
            )
        kind = profile.sample_dtype
        if kind and self.input_kind is not None and kind != self.input_kind:
            return f"sample-dtype = {kind!r}: the model expects {self.input_kind} samples"
        return None


def _most_common(values: Iterable[int]) -> int | None:
    """The value most often in ``values`` (ties: the smallest), None when empty."""
    counts: dict[int, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return min(counts, key=lambda v: (-counts[v], v)) if counts else None


def sample_nodes(
    rng: np.random.Generator, profiles: Sequence[NodeProfile], count: int
) -> list[NodeProfile]:
    """Sample ``count`` distinct nodes (all if fewer), reproducibly by partition id."""
    ordered = sorted(profiles, key=lambda p: (p.partition_id, p.node_id))
    if count >= len(ordered):
        return ordered
    picked = rng.choice(len(ordered), size=count, replace=False)
    return [ordered[i] for i in sorted(picked)]


R = TypeVar("R", bound=Result)


class FederatedNASStrategy(Strategy, Generic[R]):
    """Base class: reproducible randomness, profiles, exchanges, ledger, and Flower's
    ``start`` (a method implements ``run``, which returns its ``Result`` subclass ``R``).

    Parameters
    ----------
    seed : int
        The run's seed; every random choice of the strategy derives from it.
    min_replies : int
        Fewest accepted replies a step may end with before it fails.
    reply_timeout : float
        Seconds to wait for the replies of one step.
    min_nodes : int
        Nodes to wait for before profiling.
    """

    def __init__(
        self, *, seed: int, min_replies: int = 2, reply_timeout: float = 600.0, min_nodes: int = 2
    ) -> None:
        self.seed = seed
        self.min_replies = min_replies
        self.reply_timeout = reply_timeout
        self.min_nodes = min_nodes
        self.ledger = Ledger()
        self.profiles: dict[int, NodeProfile] = {}
        # node ids asked for a profile (each once), profiled nodes seen gone, and what the
        # first profiling settled (num-partitions, the label-counts length)
        self._asked: set[int] = set()
        self._gone: set[int] = set()
        self._agreed: dict[str, int | None] = {}
        self._profile_config = ConfigRecord()  # the config of every query.profile
        self.latency_tables: dict[int, LatencyTable] = {}
        self._reasons: dict[str, list[str]] = {}
        self._steps: dict[str, int] = {}  # exchanges per stage (their nonces' step)
        self._outbox: dict[str, list[Message]] = {}  # category -> the last configure_*'s
        self.user_train_config: dict[str, Any] = {}
        self.user_evaluate_config: dict[str, Any] = {}
        self.train_metrics: dict[int, MetricRecord] = {}
        self.server_metrics: dict[int, MetricRecord] = {}

    # --- Flower's start ---------------------------------------------------------------

    #: the field of ``self.settings`` that ``start``'s ``num_rounds`` sets (dotted for a
    #: nested recipe, e.g. ``"train.rounds"``): the main stage's rounds (FedorAS Stage 1,
    #: DecNAS iterations, FDNAS search, DP-FNAS iterations)
    rounds_setting: ClassVar[str] = ""
    settings: Any = None
    #: called with the profiles ``profile_nodes`` kept (raises to stop the run)
    validate_profiles: Callable[[Sequence[NodeProfile]], None] | None = None

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> R:
        """Run the method, with ``flwr.serverapp.strategy.Strategy.start``'s parameters.

        ``initial_arrays``: the initial global model (an empty ``ArrayRecord``: the
        model's own weights); ``num_rounds``: the main stage's rounds (it replaces the
        setting ``rounds_setting`` names); ``timeout``: the reply timeout of every step;
        ``train_config`` / ``evaluate_config``: merged into every ``train.*`` /
        ``evaluate.*`` message's config; ``evaluate_fn(round, arrays)``: called with the
        global arrays where the method has them. Other stages are configured through the
        constructor and the settings. Returns the method's ``Result`` subclass."""
        if self.rounds_setting:
            self.settings = _with_setting(self.settings, self.rounds_setting, int(num_rounds))
        self.begin(timeout, train_config, evaluate_config, evaluate_fn)
        return self.run(prompt(grid), initial_arrays)

    def run(self, grid: Grid, initial_arrays: ArrayRecord) -> R:
        """The method itself, after ``start`` took Flower's parameters."""
        raise NotImplementedError

    def begin(
        self,
        timeout: float,
        train_config: ConfigRecord | None,
        evaluate_config: ConfigRecord | None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None,
    ) -> None:
        """Take what Flower's ``start`` passes besides the grid, the arrays and the rounds:
        ``timeout`` becomes the reply timeout of every step (and of waiting for nodes);
        ``train_config`` / ``evaluate_config`` travel in every ``train.*`` / ``evaluate.*``
        message under the strategy's own keys (which win on a clash); ``evaluate_fn``,
        when given, replaces the one the constructor got."""
        self.reply_timeout = float(timeout)
        self.user_train_config = dict(train_config or {})
        self.user_evaluate_config = dict(evaluate_config or {})
        if evaluate_fn is not None:
            self.evaluate_fn = evaluate_fn
        self.train_metrics, self.server_metrics = {}, {}

    def user_config(self, message_type: str) -> dict[str, Any]:
        """The caller's ``train_config`` for ``train.*`` messages, its ``evaluate_config``
        for ``evaluate.*`` ones, nothing for the others."""
        category = message_type.split(".", 1)[0]
        if category == "train":
            return self.user_train_config
        if category == "evaluate":
            return self.user_evaluate_config
        return {}

    def with_user_config(self, message_type: str, config: Mapping[str, Any]) -> ConfigRecord:
        """``config`` over the caller's config for ``message_type`` (for the FedAvg stages,
        whose messages Flower's ``start`` builds)."""
        return ConfigRecord({**self.user_config(message_type), **dict(config)})

    def contract_result(self, result: Result, arrays: ArrayRecord) -> None:
        """Fill the fields of Flower's ``Result``: the final global ``arrays``, the main
        stage's aggregated training metrics and ``evaluate_fn``'s metrics per round."""
        result.arrays = arrays
        result.train_metrics_clientapp = dict(self.train_metrics)
        result.evaluate_metrics_serverapp = dict(self.server_metrics)

    def rng(self, purpose: str, *keys: int | str) -> np.random.Generator:
        """The run's stream for ``purpose`` and ``keys`` (round, partition id, ...); see
        :mod:`fedorasflwr.seeding`."""
        return numpy_stream(self.seed, purpose, *keys)

    # --- nodes -----------------------------------------------------------------

    def wait_for_nodes(self, grid: Grid) -> list[int]:
        """Block until ``min_nodes`` nodes are connected (at most ``reply_timeout`` s)."""
        deadline = time.monotonic() + self.reply_timeout
        while len(node_ids := list(grid.get_node_ids())) < self.min_nodes:
            if time.monotonic() > deadline:
                raise StageFailedError(
                    f"only {len(node_ids)} node(s) connected after {self.reply_timeout:.0f} s; "
                    f"at least {self.min_nodes} needed (run config 'min-nodes')"
                )
            time.sleep(0.5)
        return node_ids

    def profile_rules(self) -> ProfileRules:
        """The rules every profile must meet (``ProfileRules``): here those of the
        strategy's ``space`` when it has one (its classes; text: ``seq_len`` targets per
        sample), else the defaults; a method adds its own."""
        space = getattr(self, "space", None)
        if isinstance(space, SearchSpace):
            return ProfileRules.of_model(space)
        return ProfileRules()

    def profile_nodes(self, grid: Grid, config: ConfigRecord) -> dict[int, NodeProfile]:
        """Ask every connected node for its profile; keep those meeting ``profile_rules``
        (the others dropped, naming the node and the field) with a partition id of their own."""
        node_ids = self.wait_for_nodes(grid)
        self._profile_config = config
        replies = self._ask_profiles(grid, node_ids)
        self._agreed = {}
        profiles = self._unique_partitions(self._valid_profiles(replies))
        self.require("profile", len(profiles), len(node_ids))
        self.profiles = profiles
        for node_id, profile in profiles.items():
            self.ledger.assign(node_id, profile.partition_id)
        self._gone = set()
        log(INFO, "Profiled %d node(s)", len(profiles))
        nodes_profiled(len(profiles))  # the run's ETA, planned for this many
        if self.validate_profiles is not None:  # e.g. the runner's check of the partitions
            self.validate_profiles(list(profiles.values()))
        return profiles

    def _ask_profiles(self, grid: Grid, node_ids: Iterable[int]) -> list[Message]:
        messages = [
            Message(
                content=RecordDict({CONFIG: self._profile_config}),
                message_type=QUERY_PROFILE,
                dst_node_id=node_id,
            )
            for node_id in node_ids
        ]
        self._asked.update(m.metadata.dst_node_id for m in messages)
        return self.exchange(grid, "profile", messages)

    def _valid_profiles(self, replies: Iterable[Message]) -> dict[int, NodeProfile]:
        """The profiles of ``replies`` meeting ``profile_rules``; the rest dropped, logged
        and booked as rejected. The first profiling settles ``num-partitions`` (and, with
        ``same_length``, the label-counts length) by majority; later ones must match."""
        rules = self.profile_rules()
        parsed: dict[int, NodeProfile] = {}
        for reply in replies:
            node_id = reply.metadata.src_node_id
            try:
                parsed[node_id] = NodeProfile.from_reply(reply)
            except KeyError as exc:
                self._drop("profile", node_id, f"malformed profile: no field {exc}")
            except (TypeError, ValueError) as exc:
                self._drop("profile", node_id, f"malformed profile: {exc}")
        if not self._agreed:
            self._agreed = {
                "num-partitions": _most_common(p.num_partitions for p in parsed.values()),
                "length": _most_common(len(p.label_counts) for p in parsed.values()),
            }
        if rules.same_length and rules.num_classes is None:
            rules = replace(rules, num_classes=self._agreed["length"])
        kept: dict[int, NodeProfile] = {}
        for node_id, profile in parsed.items():
            reason = rules.problem(profile, self._agreed["num-partitions"])
            if reason is None:
                kept[node_id] = profile
                if not rules.declares_sample(profile):
                    log(
                        WARNING,
                        "[profile] node %d declares no sample-shape / sample-dtype (a client "
                        "older than this server): its samples are not checked against the "
                        "model's input %s (%s)",
                        node_id,
                        list(rules.input_shape or ()),
                        rules.input_kind,
                    )
            else:
                self._drop("profile", node_id, f"profile refused: {reason}")
        return kept

    def admit_late(self, profile: NodeProfile) -> str | None:
        """Why a node profiled mid-run (``refresh_profiles``) cannot join this run, or None
        (it joins). A method whose setup fixed per-partition state (tiers, parties) says
        which partitions it can take."""
        return None

    def refresh_profiles(self, grid: Grid) -> set[int]:
        """Before a sampling step: profile every connected node never asked (e.g. a SuperNode
        that reconnected under a new node id), with the same rules; log every profiled node
        that is gone, its partition now missing.

        A newcomer claiming the partition of a node that is gone takes it over; of a node
        still connected, the newcomer alone is refused (the holder answered first). Bad
        newcomers are dropped and logged; none of this can stop the run. Returns the node
        ids connected now."""
        connected = set(grid.get_node_ids())
        if not self._asked:  # not profiled yet
            return connected
        for node_id in sorted(set(self.profiles) - connected - self._gone):
            self._gone.add(node_id)
            log(
                WARNING,
                "[profile] node %d is gone: partition %d has no node",
                node_id,
                self.profiles[node_id].partition_id,
            )
        self._gone -= connected
        new = sorted(connected - self._asked)
        if not new:
            return connected
        arrived = self._valid_profiles(self._ask_profiles(grid, new))
        arrived = self._unique_partitions(arrived, log_missing=False)
        for node_id, profile in sorted(arrived.items()):
            reason = self.admit_late(profile)
            if reason is not None:
                self._drop("profile", node_id, f"cannot join mid-run: {reason}")
                continue
            holders = [
                n for n, p in self.profiles.items() if p.partition_id == profile.partition_id
            ]
            live = [n for n in holders if n in connected]
            if live:  # the holder answered before: a newcomer cannot take its place
                held_by = ", ".join(str(n) for n in sorted(live))
                self._drop(
                    "profile",
                    node_id,
                    f"partition id {profile.partition_id} is held by node {held_by}, "
                    "still connected: the newcomer is refused",
                )
                continue
            for old in holders:
                del self.profiles[old]
                log(
                    INFO,
                    "[profile] node %d takes over partition %d from node %d (gone)",
                    node_id,
                    profile.partition_id,
                    old,
                )
            if not holders:
                log(
                    INFO,
                    "[profile] node %d joined with partition %d",
                    node_id,
                    profile.partition_id,
                )
            self.profiles[node_id] = profile
            self.ledger.assign(node_id, profile.partition_id)
        self._reasons.pop("profile", None)  # a mid-run profiling has no minimum
        return connected

    def connected_profiles(self, grid: Grid) -> list[NodeProfile]:
        """``refresh_profiles``, then the profiles of the nodes connected now, ordered by
        partition id: the nodes a sampling step may choose from."""
        connected = self.refresh_profiles(grid)
        nodes = [p for p in self.profiles.values() if p.node_id in connected]
        return sorted(nodes, key=lambda p: (p.partition_id, p.node_id))

    def query_latency(
        self,
        grid: Grid,
        space: SearchSpace,
        nodes: Iterable[int] | None = None,
        request: LatencyRequest | None = None,
    ) -> dict[int, LatencyTable]:
        """Ask each of ``nodes`` (default: every profiled node without a table of this
        space yet) for its latency table of ``space`` (``query.latency``, once per node:
        the node caches it); keep the well-formed ones in ``latency_tables`` and return
        those of this step. A malformed table is dropped with the node and the reason."""
        spec = space.spec
        if nodes is None:
            nodes = [n for n in sorted(self.profiles) if self._table_of(n, spec) is None]
        request = request or LatencyRequest(seed=self.seed)
        config = ConfigRecord({**request.to_config(), **space_to_config(spec)})
        messages = [
            Message(RecordDict({CONFIG: config}), message_type=QUERY_LATENCY, dst_node_id=node)
            for node in nodes
        ]
        if not messages:
            return {}
        tables: dict[int, LatencyTable] = {}
        for reply in self.exchange(grid, "latency", messages):
            node_id = reply.metadata.src_node_id
            reason = check_latency_reply(reply, space.num_options())
            if reason is not None:
                self._drop("latency", node_id, reason)
                continue
            content = reply.content
            try:
                tables[node_id] = table_from_records(
                    content.metric_records[METRICS],
                    content.config_records[LATENCY],
                    spec,
                    space.num_options(),
                )
            except (KeyError, TypeError, ValueError) as exc:
                self._drop("latency", node_id, f"malformed latency table: {exc!r}")
                continue
            log(INFO, "[latency] node %d: %s", node_id, describe_table(tables[node_id]))
        self.latency_tables.update(tables)
        self.require("latency", len(tables), len(messages), at_most_sent=True)
        return tables

    def _table_of(self, node_id: int, spec: Mapping[str, Any]) -> LatencyTable | None:
        table = self.latency_tables.get(node_id)
        return table if table is not None and dict(table.spec) == dict(spec) else None

    def _unique_partitions(
        self, profiles: dict[int, NodeProfile], *, log_missing: bool = True
    ) -> dict[int, NodeProfile]:
        """Refuse every node of a partition id declared more than once, naming them all.

        Which of the nodes tells the truth cannot be known (the first to answer
        is an accident of the engine, and a liar could answer first), so all of
        them are dropped, loudly; the partitions no kept node holds are logged.
        """
        by_partition: dict[int, list[int]] = {}
        for node_id, profile in profiles.items():
            by_partition.setdefault(profile.partition_id, []).append(node_id)
        kept = dict(profiles)
        for partition_id, node_ids in sorted(by_partition.items()):
            if len(node_ids) > 1:
                names = ", ".join(str(n) for n in sorted(node_ids))
                for node_id in sorted(node_ids):
                    self._drop(
                        "profile",
                        node_id,
                        f"partition id {partition_id} declared by nodes {names}: all refused",
                    )
                    del kept[node_id]
        if log_missing and kept and len(kept) < len(profiles):
            total = max(p.num_partitions for p in profiles.values())
            held = {p.partition_id for p in kept.values()}
            missing = [pid for pid in range(total) if pid not in held]
            log(WARNING, "[profile] partitions without a node: %s", missing)
        return kept

    # --- messages ----------------------------------------------------------------

    def exchange(self, grid: Grid, stage: str, messages: Sequence[Message]) -> list[Message]:
        """Send ``messages``, count them, and return the replies without error, in
        partition-id order.

        Every message carries a nonce (``instruct``; one without is stamped here) and
        only a reply that echoes it counts (``one_reply_per_node``).  Failed replies
        (client exception, node gone) and missing ones (timed out) are logged with the
        node id and counted; they never reach the caller; a node whose only replies were
        refused is booked once, as rejected, not also as timed out.  A reply is booked
        to the node its message was sent to (matched by ``reply_to_message_id``):
        Flower's SuperLink itself answers for a lost node.  Messages to a node that reads
        packed ones travel packed (``wire.PackingGrid``; ``messages`` stay plain and the
        ledger counts their plain arrays), and replies are unpacked before anything
        reads them: a malformed packed reply is dropped, logged and booked as rejected.
        """
        expected = {m.metadata.dst_node_id for m in messages}
        if any(nonce_of(m) is None for m in messages):
            self._steps[stage] = step = self._steps.get(stage, 0) + 1
            for message in messages:
                stamp(message, stage, step)
        for message in messages:
            extra = self.user_config(message.metadata.message_type)
            if extra and CONFIG in message.content.config_records:
                own = message.content.config_records[CONFIG]
                message.content[CONFIG] = ConfigRecord({**extra, **dict(own)})
            arrays = message.content.array_records.get(ARRAYS)
            nbytes = array_record_bytes(arrays) if arrays is not None else 0
            self.ledger.sent(stage, message.metadata.dst_node_id, nbytes)
        if not messages:
            return []
        with self.ledger.timed(stage):
            wire = packing(grid, self.reads_packed)
            replies = list(wire.send_and_receive(messages, timeout=self.reply_timeout))
        # sizes, then each packed index against what was sent, before a byte is decoded
        replies, malformed = unpack_replies(replies, messages, self.reply_specs)
        for node_id, reason in malformed:
            self._drop(stage, node_id, reason)
        replies, refused = self._screen(stage, messages, replies)
        expected -= refused | {node_id for node_id, _ in malformed}
        sent_to = destinations(messages)
        good: list[Message] = []
        for reply in replies:
            node_id = answered_node(reply, sent_to)
            if node_id is None:
                log(WARNING, "[%s] ignored a reply to no message of this step", stage)
                continue
            expected.discard(node_id)
            if reply.has_error():
                kind = failure_kind(reply)
                self._fail(stage, node_id, f"{_KIND_TEXT[kind]}: {error_reason(reply)}", kind)
                continue
            arrays = reply.content.array_records.get(ARRAYS)
            self.ledger.received(stage, node_id, array_record_bytes(arrays) if arrays else 0)
            good.append(reply)
        for node_id in sorted(expected):
            reason = f"did not reply within {self.reply_timeout:.0f} s"
            self._fail(stage, node_id, reason, "timeout")
        return good

    def reads_packed(self, node_id: int) -> bool:
        """Whether instructions to ``node_id`` travel packed: its profile says its
        ClientApp reads them (a node not profiled yet: plain)."""
        profile = self.profiles.get(node_id)
        return profile is not None and profile.reads_packed

    def claim(self, node_id: int, *splits: str, epochs: int = 1, per_sample: int = 1) -> Bound:
        """``NodeProfile.bound`` of ``node_id`` (a node never profiled can claim nothing)."""
        profile = self.profiles.get(node_id)
        if profile is None:
            return Bound(0, f"node {node_id} was never profiled")
        return profile.bound(*splits, epochs=epochs, per_sample=per_sample)

    def one_reply_per_node(
        self, stage: str, messages: Sequence[Message], replies: Sequence[Message]
    ) -> list[Message]:
        """The first reply of each addressed node that answers the instruction sent to it
        (its type and nonce), in partition-id order; every other reply (duplicate, second
        altered one, wrong type, stale or without nonce, unaddressed node) is dropped and
        logged."""
        return self._screen(stage, messages, replies)[0]

    def _screen(
        self, stage: str, messages: Sequence[Message], replies: Iterable[Message]
    ) -> tuple[list[Message], set[int]]:
        """``one_reply_per_node``, and the addressed nodes that had a reply refused."""
        kept, refused = screen_replies(messages, replies)
        for node_id, reason in refused:
            self._drop(stage, node_id, reason)
        addressed = {m.metadata.dst_node_id for m in messages}
        return self.in_order(kept), {n for n, _ in refused if n in addressed}

    def in_order(self, replies: Iterable[Message]) -> list[Message]:
        """``replies`` by the partition id of their sender (a node never profiled, e.g.
        while profiling, after the others, as they came): every sum over replies is
        taken in this order, whatever order the engine delivered them in."""
        return sorted(replies, key=lambda r: self._partition_of(r.metadata.src_node_id))

    def _partition_of(self, node_id: int) -> float:
        profile = self.profiles.get(node_id)
        return math.inf if profile is None else profile.partition_id

    def instruct(
        self, category: str, stage: str, step: int, messages: Iterable[Message]
    ) -> list[Message]:
        """``messages``, one step's ``category`` instructions (``"train"``: of
        ``configure_train``, ``"evaluate"``: of ``configure_evaluate``), each with a nonce
        of ``stage`` and ``step``; kept as what the next ``aggregate_*`` of ``category``
        screens its replies against (``screened``). Every ``configure_*`` returns its
        messages through here."""
        self._outbox[category] = [stamp(m, stage, step) for m in messages]
        return list(self._outbox[category])

    def screened(self, stage: str, category: str, replies: Iterable[Message]) -> list[Message]:
        """``replies`` screened against the instructions the last ``configure_*`` of
        ``category`` (``"train"``, ``"evaluate"``) sent (``one_reply_per_node``), in
        partition-id order: what every public ``aggregate_*`` does first, whoever calls it
        (``exchange`` or a Flower user's own loop).  Replies that pass ``exchange`` pass
        here again unchanged; a packed reply is unpacked first (malformed: dropped)."""
        sent = self._outbox.get(category, [])
        replies, malformed = unpack_replies(replies, sent, self.reply_specs)
        for node_id, reason in malformed:
            self._drop(stage, node_id, reason)
        return self.one_reply_per_node(stage, sent, replies)

    def reply_specs(self, instruction: Message) -> Mapping[str, ArraySpec] | None:
        """The arrays a reply to ``instruction`` may carry, which a packed reply's index
        must match before anything of it is decoded (``wire.unpack_replies``): by default
        those it sent (``replies.reply_specs``). A method whose instruction asks back
        arrays it does not carry (DecNAS's upload) names them here."""
        return reply_specs(instruction)

    def _fail(self, stage: str, node_id: int, reason: str, kind: FailureKind) -> None:
        self.ledger.failed(stage, node_id, kind)
        self._reasons.setdefault(stage, []).append(reason)
        log(WARNING, "[%s] node %d %s", stage, node_id, reason)

    def accept(
        self, stage: str, replies: Iterable[Message], check: Callable[[Message], str | None]
    ) -> list[Message]:
        """Replies for which ``check`` finds nothing wrong; the others are dropped and logged
        (a ``check`` that raises on a reply drops it too, naming the exception). An error
        reply (Flower's ``msg.has_error()``) is skipped and booked as a failure, as
        Flower's FedAvg skips it."""
        accepted = []
        for reply in replies:
            if reply.has_error():
                node_id = reply.metadata.src_node_id
                self._fail(stage, node_id, f"failed: {error_reason(reply)}", failure_kind(reply))
                continue
            try:
                reason = check(reply)
            except Exception as exc:  # noqa: BLE001 - a client's reply never stops a run
                reason = f"unreadable reply: {type(exc).__name__}: {exc}"[:300]
            if reason is None:
                accepted.append(reply)
            else:
                self._drop(stage, reply.metadata.src_node_id, reason)
        return accepted

    def _drop(self, stage: str, node_id: int, reason: str) -> None:
        self.ledger.rejected(stage, node_id)
        self._reasons.setdefault(stage, []).append(f"dropped: {reason}")
        log(WARNING, "[%s] dropped reply of node %d: %s", stage, node_id, reason)

    def require(self, stage: str, accepted: int, sent: int, *, at_most_sent: bool = False) -> None:
        """Fail loudly when a step ends with fewer than ``min_replies`` good replies
        (with ``at_most_sent``, fewer than ``min(min_replies, sent)``, at least one:
        for steps that may address fewer nodes, e.g. the clients of the top tier)."""
        reasons = self._reasons.pop(stage, [])
        needed = max(1, min(self.min_replies, sent)) if at_most_sent else self.min_replies
        if accepted < needed:
            distinct = list(dict.fromkeys(reasons))[:3]
            raise StageFailedError(
                f"[{stage}] {accepted} usable repl{'y' if accepted == 1 else 'ies'} "
                f"out of {sent} message(s) sent; at least {needed} required "
                f"(run config 'min-replies'). Reasons: {'; '.join(distinct) or 'none given'}"
            )

    #: how every aggregation of this strategy combines a key's updates (a method's
    #: settings ``aggregation_rule``, ``aggregation_trim``: set from them on construction)
    aggregation: Aggregation = MEAN

    # --- server-side validation -------------------------------------------------------

    evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None

    def record_step(
        self,
        step: int,
        arrays: ArrayRecord,
        history: list[dict[str, Any]],
        entry: dict[str, Any],
        *,
        every: int,
        last: bool,
        label: str = "round",
    ) -> None:
        """Append ``entry`` to ``history``, with ``val-*`` metrics from ``evaluate_fn``
        every ``every`` steps and at the last one (``every=0``: never): a key that does not
        start with ``val-`` gets it (the built-in evaluators' keys already do, so the
        history and ``result.evaluate_metrics_serverapp`` name each number the same)."""
        if self.evaluate_fn is not None and every and (step % every == 0 or last):
            with self.ledger.timed("evaluate"):
                metrics = self.evaluate_fn(step, arrays)
            if metrics is not None:
                self.server_metrics[step] = metrics
                # one name per number: the history's and evaluate_metrics_serverapp's
                entry.update(
                    {k if k.startswith("val-") else f"val-{k}": v for k, v in metrics.items()}
                )
                log(
                    DEBUG, "%s %d validation: %s", label.capitalize(), step, format_metrics(metrics)
                )
        history.append({label: step, **entry})

    # --- progress: checkpoints and partial results ---------------------------------------

    #: called with every ``Snapshot`` the strategy reaches (the runner's ``Checkpointer``)
    on_progress: Callable[[Snapshot], None] | None = None

    def reached(
        self,
        stage: str,
        step: int,
        arrays: ArrayRecord | None = None,
        *,
        history: Any = None,
        stage_done: bool = False,
        space: dict[str, Any] | None = None,
        **progress: Any,
    ) -> None:
        """Report ``step`` rounds or iterations of ``stage`` done (0 without ``arrays``:
        the stage begins); ``progress`` is what resuming needs besides the weights."""
        if self.on_progress is not None:
            self.on_progress(
                Snapshot(stage, step, arrays, self.ledger, history, progress, stage_done, space)
            )

    # --- Strategy defaults: no client-side evaluation rounds -------------------------

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """No evaluation messages (a method that evaluates federatedly overrides this)."""
        return []

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Nothing to aggregate (error replies, if any, are skipped)."""
        return None


def describe_table(table: LatencyTable) -> str:
    """One log line of a node's table: device, threads, range, its validation."""
    low = table.fixed_ms + sum(min(layer) for layer in table.option_ms)
    high = table.fixed_ms + sum(max(layer) for layer in table.option_ms)
    text = (
        f"{table.device}, {table.threads} thread(s), paths {low:.4g}-{high:.4g} ms "
        f"(fixed {table.fixed_ms:.4g} ms)"
    )
    check = table.validation
    if check is not None:
        text += (
            f"; against {check.paths} measured subnets: Spearman rho {check.spearman_rho:.3f}, "
            f"median relative error {check.relative_error:.3f}"
        )
    return text


def _with_setting(settings: Any, path: str, value: Any) -> Any:
    """A copy of frozen dataclass ``settings`` with the (dotted) field ``path`` set."""
    head, _, rest = path.partition(".")
    inner = _with_setting(getattr(settings, head), rest, value) if rest else value
    return replace(settings, **{head: inner})
