"""HeteroFL and FjORD: federated training of one width-sliceable model across tiers.

Each round samples ``clients-per-round`` nodes; each gets the leading channel slice of
the global model at its tier's width (``search_spaces.widths.sub_arrays``), trains it
(HeteroFL: at that width; FjORD: ordered dropout over the ladder up to it) and replies;
the server averages every parameter entry over the clients whose slice holds it,
weighted by their examples (``aggregate_slices``); entries no client held keep their
value.  At the end each tier's model (the global model at its width) is tested on the
test splits of the tier's nodes.  The two methods differ only in the client's loop and
its settings (``mode`` in every message).

The model is the built-in ConvNet at an ``image`` spec, or any width-scalable model of the
user's: ``model_fn(width) -> nn.Module`` whose every tensor at width ``p`` is the leading
corner of the full model's tensor of the same name (checked on construction); the
clients import the factory back by its path (``model.factory_path``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from logging import INFO
from typing import Any, ClassVar

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result
from flwr.supercore import log

from ...arrays import record_of
from ...checkpoints import Resume
from ...costs import COST_CONVENTION
from ...federation.aggregation import Aggregation
from ...federation.base import FederatedNASStrategy, NodeProfile, ProfileRules, sample_nodes
from ...federation.replies import array_specs, check_reply
from ...progress import StageClock
from ...protocol import ARRAYS, CONFIG, METRICS, sample_kind
from ...search_spaces.widths import (
    ModelFn,
    aggregate_slices,
    model_costs,
    sub_arrays,
    width_model_shapes,
    width_net,
)
from ...seeding import seed_torch
from .messages import WIDTHS_EVALUATE, WIDTHS_TRAIN
from .model import MODEL_FN, factory_path, input_of_profiles
from .settings import FjORDSettings, HeteroFLSettings, WidthSettings

__all__ = ["FjORD", "HeteroFL", "TierWidth", "WidthResult", "WidthStrategy"]

TRAIN, EVALUATE = WIDTHS_TRAIN, WIDTHS_EVALUATE
#: the one stage a checkpoint can be taken in (its steps: rounds)
STAGE = "train"


@dataclass(kw_only=True)
class TierWidth:
    """One tier's model: the global model at the tier's width (FjORD: its p_max).
    ``tier`` is 0-based here and 1-based (T1 = the smallest width) in ``summary()``,
    ``result.json`` and file names, as FedorAS's tiers are."""

    tier: int
    width: float
    macs: int
    flops: int
    params: int
    partitions: list[int] = field(default_factory=list)
    test_accuracy: float | None = None
    test_count: int = 0
    global_test_accuracy: float | None = None

    def summary(self) -> dict[str, Any]:
        return {
            "tier": self.tier + 1,  # 1-based, as users see it
            "width": self.width,
            "macs": self.macs,
            "flops": self.flops,
            "params": self.params,
            "partitions": self.partitions,
            "test_accuracy": self.test_accuracy,
            "test_count": self.test_count,
            "global_test_accuracy": self.global_test_accuracy,
        }


@dataclass(kw_only=True, repr=False)
class WidthResult(Result):
    """What ``HeteroFL.start`` / ``FjORD.start`` return: Flower's ``Result`` (``arrays``:
    the full-width global model), each tier's model, the per-round history, the ledger."""

    tiers: list[TierWidth] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    ledger: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {
            "resource-convention": COST_CONVENTION,
            "tiers": [t.summary() for t in self.tiers],
            "history": self.history,
            "ledger": self.ledger,
        }


def to_numpy(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {key: array.numpy() for key, array in record.items()}


def to_record(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    return record_of({key: np.array(v, order="C") for key, v in arrays.items()})


class WidthStrategy(FederatedNASStrategy[WidthResult]):
    """One fixed architecture trained at per-tier widths (see the module docstring).

    Parameters
    ----------
    settings : WidthSettings
        The method's settings (``HeteroFLSettings`` / ``FjORDSettings``).
    seed : int
        Fixes the initial weights of an empty ``initial_arrays`` (stream ``init``, as
        the project's runner draws them), the sampling and the clients' batches and
        widths.
    image : mapping, optional
        The built-in ConvNet (``search_spaces.widths.width_net``) for images of this spec:
        ``num_classes``, ``in_channels``, ``input_height``, ``input_width``; its head is
        ``settings.head``.  Give
        exactly one of ``image`` and ``model_fn``.
    model_fn : callable, optional
        A width-scalable model of your own: ``model_fn(width) -> nn.Module`` for
        ``0 < width <= 1``, ``model_fn(1.0)`` the full model, every tensor of the
        width-``p`` model the leading corner of the full model's tensor of the same name
        (checked for every width of the ladder, ``ValueError`` naming the tensor and
        both shapes).  A function or class at the top level of a module the ClientApp
        imports: the clients import it back by its path.
    input_shape : sequence of int, optional
        With ``model_fn``: one sample's shape (no batch dimension), on which each
        width's FLOPs are counted (``torch.utils.flop_counter``, one zero sample) and
        every node's profiled ``sample-shape`` is checked.  Default: the
        ``sample-shape`` / ``sample-dtype`` the profiled nodes declare (the costs are
        then known after profiling).  The built-in ConvNet takes it from ``image``.
    input_dtype : torch.dtype
        With ``model_fn`` and ``input_shape``: the sample's dtype (default float32).
    evaluate_fn : callable, optional
        ``evaluate_fn(round, arrays) -> MetricRecord | None``, called after every
        training round with the full-width global model (``start``'s, when given,
        replaces it); its metrics go to ``result.evaluate_metrics_serverapp`` and, as
        ``val-<key>``, to that round's history entry.
    validate_profiles : callable, optional
        Called with the node profiles before any training; raise to stop.
    resume : Resume, optional
        A checkpoint of the training rounds: the run continues with the round after it
        (its global model, history and ledger); tiers and sampling are recomputed from
        the profiles and the seed, so the resumed run equals the uninterrupted one.
    min_nodes : int
        Nodes to wait for before profiling.
    """

    #: the client's loop ("heterofl" / "fjord"), sent in every message
    mode: ClassVar[str] = ""
    rounds_setting = "train.rounds"

    def __init__(
        self,
        *,
        settings: WidthSettings,
        seed: int,
        image: Mapping[str, int] | None = None,
        model_fn: ModelFn | None = None,
        input_shape: Sequence[int] | None = None,
        input_dtype: torch.dtype = torch.float32,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
        validate_profiles: Callable[[Sequence[NodeProfile]], None] | None = None,
        resume: Resume | None = None,
        min_nodes: int = 2,
    ) -> None:
        name = type(self).__name__
        if (image is None) == (model_fn is None):
            raise ValueError(
                f"{name}: give exactly one of image (the built-in ConvNet's image spec) and "
                f"model_fn (a width-scalable model of your own); got "
                f"{'both' if image is not None else 'neither'}"
            )
        super().__init__(seed=seed, min_replies=settings.min_replies, min_nodes=min_nodes)
        self.resume: Resume | None = resume
        self.settings = settings
        self.aggregation = Aggregation.of(settings)
        self.evaluate_fn = evaluate_fn
        self.validate_profiles = validate_profiles
        self.image = None if image is None else dict(image)
        #: the factory's import path, sent to the clients (None: the built-in ConvNet)
        self.model_path: str | None = None
        #: one sample's shape and dtype, what the costs are measured on (None: not known
        #: until the nodes are profiled)
        self.input: tuple[tuple[int, ...], torch.dtype] | None = None
        if model_fn is not None:
            self.model_fn: ModelFn = model_fn
            self.model_path = factory_path(model_fn, name)
            if input_shape is not None:
                self.input = (tuple(int(d) for d in input_shape), input_dtype)
        else:
            self.model_fn = partial(width_net, self.image, head=settings.head)
            keys = ("in_channels", "input_height", "input_width")
            self.input = (tuple(int(self.image[k]) for k in keys), torch.float32)
        with torch.random.fork_rng(devices=[]):  # the caller's RNG stays as it was
            seed_torch(seed, "init")  # the runner's initial weights, whoever calls
            self.net = self.model_fn(1.0)
            try:
                self.shapes = width_model_shapes(self.model_fn, settings.ladder, full=self.net)
            except ValueError as err:
                raise ValueError(f"{name}: {err}") from err
        #: width -> its model's ``flops``, ``macs``, ``params`` (known once the input is)
        self.costs: dict[float, dict[str, Any]] = {}
        if self.input is not None:
            self.measure_costs(*self.input)
        self.tiers: dict[int, int] = {}  # node id -> tier
        self._global = ArrayRecord()  # the full-width global model
        self._specs: dict[float, dict[str, Any]] = {}  # width -> its slice's array specs

    def summary(self) -> None:
        s = self.settings
        model = "ConvNet" if self.model_path is None else self.model_path
        log(INFO, "\t├── %s: %s, tier widths %s", self.mode, model, list(s.tier_widths))
        log(INFO, "\t└── ladder %s, %d rounds", list(s.ladder), s.train.rounds)

    # --- the model --------------------------------------------------------------------

    def measure_costs(self, input_shape: Sequence[int], input_dtype: torch.dtype) -> None:
        """Each ladder width's FLOPs, MACs (one sample of ``input_shape``) and parameters."""
        self.input = (tuple(int(d) for d in input_shape), input_dtype)
        with torch.random.fork_rng(devices=[]):
            self.costs = {
                w: model_costs(self.model_fn(w), w, *self.input) for w in self.settings.ladder
            }

    def profile_rules(self) -> ProfileRules:
        """A model of the user's with a known input: every node's ``sample-shape`` and
        ``sample-dtype`` kind must be its; the built-in ConvNet checks none."""
        if self.model_path is None or self.input is None:
            return super().profile_rules()
        shape, dtype = self.input
        return ProfileRules(input_shape=shape, input_kind=sample_kind(dtype))

    # --- tiers ------------------------------------------------------------------------

    def tier_of(self, profile: NodeProfile) -> int:
        """The node's tier (0-based): its node config's ``tier`` where declared (1-based,
        1 = the smallest width, as for FedorAS), else ``partition_id * tiers //
        num_partitions``; a declared tier outside 1 .. tiers raises ``ValueError``."""
        count = len(self.settings.tier_widths)
        if profile.tier >= 0:
            if not 1 <= profile.tier <= count:
                raise ValueError(
                    f"node {profile.node_id} declares tier {profile.tier}: allowed 1..{count} "
                    f"(run config '{self.settings.TABLE}' widths name {count} tiers)"
                )
            return profile.tier - 1
        return profile.partition_id * count // max(profile.num_partitions, 1)

    def width_of(self, node_id: int) -> float:
        return self.settings.tier_widths[self.tiers[node_id]]

    # --- messages ---------------------------------------------------------------------

    def message_config(self, server_round: int, width: float) -> dict[str, Any]:
        config = {
            "method": self.mode,
            "mode": self.mode,
            "seed": self.seed,
            "server-round": server_round,
            "width": width,
            "widths": list(self.settings.ladder),
            "width-macs": [int(self.costs[w]["macs"]) for w in self.settings.ladder],
            "distill": self.settings.distill,
        }
        if self.image is None:
            return {**config, MODEL_FN: self.model_path}
        return {
            **config,
            "num-classes": self.image["num_classes"],
            "in-channels": self.image["in_channels"],
            "input-height": self.image["input_height"],
            "input-width": self.image["input_width"],
            "head": self.settings.head,
        }

    def _messages(
        self, arrays: ArrayRecord, nodes: Iterable[NodeProfile], server_round: int, kind: str
    ) -> list[Message]:
        full = to_numpy(arrays)
        messages = []
        for node in nodes:
            width = self.width_of(node.node_id)
            config = self.message_config(server_round, width)
            if kind == TRAIN:
                config.update(self.settings.train.client_config())
            record = to_record(sub_arrays(full, self.shapes[width]))
            messages.append(
                Message(
                    RecordDict({ARRAYS: record, CONFIG: ConfigRecord(config)}),
                    message_type=kind,
                    dst_node_id=node.node_id,
                )
            )
        return messages

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """One round's training messages: each sampled node's slice at its tier width."""
        connected = set(grid.get_node_ids())
        candidates = [p for p in self.profiles.values() if p.node_id in connected]
        rng = self.rng("widths-sample", server_round)
        chosen = sample_nodes(rng, candidates, self.settings.train.clients(len(candidates)))
        messages = self._messages(arrays, chosen, server_round, TRAIN)
        return self.instruct("train", "train", server_round, messages)

    def check_train_reply(self, reply: Message) -> str | None:
        node_id = reply.metadata.src_node_id
        if node_id not in self.tiers:
            return f"node {node_id} has no tier"
        width = self.width_of(node_id)
        bounds = {"num-examples": self.claim(node_id, "train")}
        return check_reply(reply, sent=self._specs[width], bounds=bounds)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Every entry averaged over the accepted replies whose slice holds it, weighted by
        ``num-examples`` (``aggregate_slices``); replies screened first."""
        replies = self.accept(
            "train", self.screened("train", "train", replies), self.check_train_reply
        )
        if not replies:
            return None, None
        updates = []
        flops = 0
        loss = 0.0
        for reply in replies:
            metrics = reply.content.metric_records[METRICS]
            width = self.width_of(reply.metadata.src_node_id)
            arrays = to_numpy(reply.content.array_records[ARRAYS])
            updates.append((arrays, width, int(metrics["num-examples"])))
            loss += float(metrics.get("train-loss", math.nan)) * int(metrics["num-examples"])
            spent = int(metrics.get("train-flops", 0))
            self.ledger.node("train", reply.metadata.src_node_id).train_flops += spent
            flops += spent
        fused = aggregate_slices(to_numpy(self._global), updates, self.aggregation)
        total = sum(n for _, _, n in updates)
        return to_record(fused), MetricRecord(
            {
                "num-examples": total,
                "clients": len(updates),
                "train-flops": flops,
                "train-loss": loss / max(total, 1),  # weighted by examples, as FedAvg's
            }
        )

    # --- the run ----------------------------------------------------------------------

    def run(self, grid: Grid, initial_arrays: ArrayRecord) -> WidthResult:
        """Profile, assign tiers, ``train.rounds`` rounds of slice-wise FedAvg (after each,
        ``evaluate_fn`` on the full-width global model), test each tier's model on its
        nodes' test splits."""
        s = self.settings
        log(INFO, "Starting %s", self.mode)
        self.summary()
        with self.ledger.timed("setup"):
            self.setup(grid)
        history: list[dict[str, Any]] = []
        first = 1
        if self.resume is not None:
            self.ledger.restore(self.resume.ledger)
            self.use_model(self.resume.arrays)
            history = [dict(h) for h in self.resume.history or []]
            first = self.resume.step + 1
            log(
                INFO,
                "%s resumed after round %d (%s)",
                self.mode,
                self.resume.step,
                self.resume.path,
            )
        else:
            self.use_model(initial_arrays)
            self.reached(STAGE, 0)
        clock = StageClock(self.mode, s.train.rounds, first)
        for server_round in range(first, s.train.rounds + 1):
            messages = list(self.configure_train(server_round, self._global, ConfigRecord(), grid))
            replies = self.exchange(grid, "train", messages)
            fused, metrics = self.aggregate_train(server_round, replies)
            self.require("train", 0 if fused is None else int(metrics["clients"]), len(messages))
            assert fused is not None and metrics is not None
            self._global = fused
            self.train_metrics[server_round] = metrics
            entry = {
                "clients": int(metrics["clients"]),
                "train-flops": int(metrics["train-flops"]),
                "train-loss": float(metrics["train-loss"]),
            }
            done = server_round == s.train.rounds
            self.record_step(server_round, fused, history, entry, every=1, last=done)
            shown = {"train-loss": entry["train-loss"]}
            log(
                INFO,
                "%s",
                clock.line(server_round, shown, clients=f"{entry['clients']}/{len(messages)}"),
            )
            self.reached(STAGE, server_round, fused, history=history, stage_done=done)
        tiers = self.test_tiers(grid)
        result = WidthResult(tiers=tiers, history=history, ledger=self.ledger.summary())
        self.contract_result(result, self._global)
        return result

    def setup(self, grid: Grid) -> None:
        """Profile the nodes and give each its tier (``tier_of``); a model given without
        its input gets it from the profiles (``input_of_profiles``) and its costs; the
        global model is the net's initial weights until ``use_model`` (what ``run`` does
        first)."""
        self.profile_nodes(grid, ConfigRecord({"method": self.mode}))
        if self.input is None:
            self.measure_costs(*input_of_profiles(self.profiles, type(self).__name__))
        self.tiers = {n: self.tier_of(p) for n, p in self.profiles.items()}
        self.use_model(ArrayRecord())

    def use_model(self, arrays: ArrayRecord) -> None:
        """Make ``arrays`` the full-width global model (empty: the net's initial weights,
        drawn from the seed), and its slices' specs what every reply is checked against."""
        if not len(arrays):
            arrays = record_of(self.net.state_dict())
        full = to_numpy(arrays)
        for name, shape in self.shapes[1.0].items():
            if name not in full or tuple(full[name].shape) != shape:
                raise ValueError(f"initial arrays: {name!r} is not the full-width {shape}")
        self._global = arrays
        self._specs = {
            w: array_specs(to_record(sub_arrays(full, shape))) for w, shape in self.shapes.items()
        }

    def tier_arrays(self, tier: int) -> ArrayRecord:
        """The global model at ``tier``'s width (its leading slice)."""
        width = self.settings.tier_widths[tier]
        return to_record(sub_arrays(to_numpy(self._global), self.shapes[width]))

    def test_tiers(self, grid: Grid) -> list[TierWidth]:
        """Each tier's model on the test splits of the tier's connected nodes."""
        connected = set(grid.get_node_ids())
        nodes = [p for p in self.profiles.values() if p.node_id in connected]
        messages = self._messages(self._global, nodes, 0, EVALUATE)
        messages = self.instruct("evaluate", "test", 1, messages)
        replies = self.accept(
            "test",
            self.exchange(grid, "test", messages),
            lambda r: check_reply(
                r,
                counts=("num-examples", "correct"),
                bounds={"num-examples": self.claim(r.metadata.src_node_id, "test")},
            ),
        )
        correct: dict[int, int] = {}
        count: dict[int, int] = {}
        for reply in replies:
            tier = self.tiers[reply.metadata.src_node_id]
            metrics = reply.content.metric_records[METRICS]
            correct[tier] = correct.get(tier, 0) + int(metrics["correct"])
            count[tier] = count.get(tier, 0) + int(metrics["num-examples"])
        out = []
        for tier, width in enumerate(self.settings.tier_widths):
            cost = self.costs[width]
            held = sorted(self.profiles[n].partition_id for n, t in self.tiers.items() if t == tier)
            n = count.get(tier, 0)
            out.append(
                TierWidth(
                    tier=tier,
                    width=width,
                    macs=int(cost["macs"]),
                    flops=int(cost["flops"]),
                    params=int(cost["params"]),
                    partitions=held,
                    test_accuracy=correct.get(tier, 0) / n if n else None,
                    test_count=n,
                )
            )
        return out


class HeteroFL(WidthStrategy):
    """HeteroFL (Diao et al., 2021): a static width per tier, slice-wise averaging.

    ``settings``: ``HeteroFLSettings``; see ``WidthStrategy`` and docs/baselines.md."""

    mode = "heterofl"

    def __init__(self, *, settings: HeteroFLSettings, **kwargs: Any) -> None:
        super().__init__(settings=settings, **kwargs)


class FjORD(WidthStrategy):
    """FjORD (Horvath et al., 2021): ordered dropout over the ladder up to each tier's
    p_max, per batch; slice-wise averaging; each tier's model at its p_max.

    ``settings``: ``FjORDSettings``; see ``WidthStrategy`` and docs/baselines.md."""

    mode = "fjord"

    def __init__(self, *, settings: FjORDSettings, **kwargs: Any) -> None:
        super().__init__(settings=settings, **kwargs)
