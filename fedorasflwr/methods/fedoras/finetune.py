"""FedorAS Stage 3 (paper §3.3): per-tier FedAvg fine-tuning of the searched subnets.

The subnet a tier's search chose is extracted from the supernet (or, for the
rand-init comparison, from a freshly initialised supernet of the same space)
and trained with Flower's FedAvg (``SeededFedAvg``) over the clients of that
tier *and the tiers above it* only, with a cosine learning-rate schedule (or the
paper's Shakespeare step schedule, ``finetune-lr-schedule = "step"``).  It
is then tested on every eligible client's test split: pooled accuracy and
loss (perplexity for text), and the spread over clients (mean, standard
deviation, worst; the paper's fairness view, Table 7).

Client contract
---------------
``train.fedoras_finetune``
    arrays: the subnet's ``state_dict``.  config: ``method``, ``arch`` (option
    indices), ``seed``, ``server-round``, ``lr`` (this round's), ``momentum``,
    ``weight-decay``, ``grad-clip``, ``local-epochs``, ``batch-size``, ``net-flops`` and
    ``space.<kwarg>``.  Reply: the trained ``arrays`` and ``metrics``
    (``num-examples``, ``train-loss``, ``train-flops``).
``evaluate.fedoras_finetune``
    Same arrays and config; reply ``metrics``: ``num-examples``, ``correct``,
    ``loss-sum`` and ``accuracy`` on the local test split.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, TensorDataset

from ...arrays import record_of, state_dict_of
from ...costs import describe_flops, flops_to_macs, training_flops
from ...federation.base import NodeProfile
from ...federation.fedavg import SeededFedAvg, cosine_lr, step_lr
from ...federation.replies import check_reply
from ...progress import fmt, format_seconds
from ...protocol import ARRAYS, CONFIG, METRICS, space_to_config
from ...search_spaces import build_space
from ...seeding import seed_torch
from ...training import evaluate, recalibrate_batchnorm, torch_device
from .context import StageContext
from .messages import FEDORAS_EVALUATE, FEDORAS_TRAIN
from .search import initial_paths
from .tiers import PathCost, Tier

__all__ = [
    "TierModel",
    "TierTest",
    "finetune_tier",
    "random_search_tier",
    "test_subnet",
]

SUPERNET_INIT = "supernet"
RANDOM_INIT = "random"
RANDOM_SEARCH = "random-search"


@dataclass
class TierTest:
    """A subnet's test result over the clients that may run it."""

    accuracy: float
    loss: float
    examples: int
    clients: int
    client_mean: float
    client_std: float
    client_worst: float
    perplexity: float | None = None


@dataclass
class TierModel:
    """One tier's fine-tuned subnet."""

    tier: int
    init: str
    arch: tuple[int, ...]
    names: list[str]
    flops: int
    params: int
    search_accuracy: float
    arrays: ArrayRecord
    history: list[dict[str, Any]] = field(default_factory=list)
    test: TierTest | None = None
    #: predicted latency on the tier's devices (``fedoras.resource = "latency"``)
    latency_ms: float | None = None
    #: accuracy on the server's global test set and its samples (``data.global-test``;
    #: set by the app's runner, ``runs.GlobalTest``)
    global_test_accuracy: float | None = None
    global_test_count: int | None = None

    @property
    def macs(self) -> int:
        """MACs of one sample (``flops / 2``; the papers' "FLOPs")."""
        return int(flops_to_macs(self.flops))

    def summary(self) -> dict[str, Any]:
        return {
            "tier": self.tier + 1,
            "init": self.init,
            "arch": list(self.arch),
            "options": self.names,
            "flops": self.flops,
            "macs": self.macs,
            "params": self.params,
            **({} if self.latency_ms is None else {"latency-ms": self.latency_ms}),
            "search-accuracy": None if math.isnan(self.search_accuracy) else self.search_accuracy,
            "test": None if self.test is None else vars(self.test),
            **(
                {}
                if self.global_test_accuracy is None
                else {
                    "global-test-accuracy": self.global_test_accuracy,
                    "global-test-count": self.global_test_count,
                }
            ),
            "history": self.history,
        }


#: the test numbers a fine-tuned model's log line shows
TEST_KEYS = ("accuracy", "loss", "clients", "client_worst")


def _subnet_config(context: StageContext, arch: Sequence[int], init: str) -> dict[str, Any]:
    s = context.settings
    return {
        "method": "fedoras",
        "phase": f"finetune-{init}",
        "seed": context.federation.seed,
        "arch": [int(v) for v in arch],
        **s.finetune.client_config(),
        "grad-clip": s.grad_clip,
        "net-flops": int(context.space.cost(arch).flops),
        **space_to_config(context.space.spec),
    }


def initial_subnet(
    context: StageContext,
    supernet: ArrayRecord,
    arch: Sequence[int],
    init: str,
    tier: int,
    candidate: int = 0,
) -> ArrayRecord:
    """The subnet's starting weights: cut from the trained supernet, or freshly
    initialised (seeded by the run seed, the tier and the candidate) otherwise.

    Cut from the supernet, the subnet is the model the server-side search scored: its
    BatchNorm statistics are re-estimated on the server's calibration batches (with
    ``search-recalibrate-bn``), so the fine-tuning curve starts at the searched accuracy.
    The supernet's own running statistics mix every path through each option and can
    score far below it.  Clients train in train mode, so only the running statistics
    differ, and the first rounds overwrite them."""
    if init == SUPERNET_INIT:
        keys = context.space.path_keys(arch)
        scorer = context.server_scorer
        if scorer is None or scorer.calibration is None:
            return ArrayRecord({k: supernet[k] for k in keys})
        state = scorer.scored_state(supernet, arch)
        return ArrayRecord({k: state[k] for k in keys})
    seed_torch(context.federation.seed, "rand-init", tier, candidate)
    fresh = context.space.fresh().subnet(arch)
    return record_of(fresh.state_dict())


def _server_curve(
    spec: Mapping[str, Any],
    arch: Sequence[int],
    data: Dataset | None,
    calibration: Sequence[Tensor] | None = None,
) -> Callable[[int, ArrayRecord], MetricRecord | None] | None:
    """Server-side validation of the subnet after each round (the fine-tuning curve);
    ``spec``: the search space's ``build_space`` arguments.  With ``calibration`` (the
    server scorer's batches, as the search scored it), the round's BatchNorm statistics
    are first re-estimated on them for the aggregated weights: the aggregate carries the
    mean of statistics each client computed for its own weights."""
    if data is None or len(data) == 0:
        return None
    net = build_space(**spec).subnet(arch)
    device = torch_device()
    loader = DataLoader(data, batch_size=256)

    def curve(_round: int, arrays: ArrayRecord) -> MetricRecord:
        net.load_state_dict(state_dict_of(arrays))
        net.to(device)
        if calibration is not None:
            recalibrate_batchnorm(net, net, calibration, device)
        net.eval()
        result = evaluate(net, loader, device)
        return MetricRecord({"val-accuracy": result.accuracy, "val-loss": result.loss})

    return curve


def finetune_tier(
    context: StageContext,
    grid: Grid,
    supernet: ArrayRecord,
    tier: int,
    arch: Sequence[int],
    search_accuracy: float,
    *,
    init: str = SUPERNET_INIT,
    server_data: TensorDataset | None = None,
    rounds: int | None = None,
    clients_per_round: int | None = None,
    candidate: int = 0,
) -> TierModel:
    """Fine-tune ``arch`` with FedAvg on the tier's eligible clients (``finetune-rounds``
    rounds of ``finetune-clients-per-round`` clients unless ``rounds`` or
    ``clients_per_round`` is given), then test it there."""
    started = time.perf_counter()
    s, space, federation = context.settings, context.space, context.federation
    num_rounds = s.finetune.rounds if rounds is None else rounds
    per_round = s.finetune.clients_per_round if clients_per_round is None else clients_per_round
    stage = f"finetune-t{tier + 1}-{init}" + (f"-{candidate}" if init == RANDOM_SEARCH else "")
    nodes = context.eligible(tier)
    arrays = initial_subnet(context, supernet, arch, init, tier, candidate)
    config = _subnet_config(context, arch, init)
    scorer = context.server_scorer
    # the curve re-estimates BN on the scorer's calibration batches, so it scores the
    # disjoint part of the server's slice, as the search did (not the batches themselves)
    calibration = None if scorer is None else scorer.calibration
    curve_data = server_data if scorer is None or server_data is None else scorer.scored
    cost = space.cost(arch)
    model = TierModel(
        tier=tier,
        init=init,
        arch=tuple(int(v) for v in arch),
        names=space.option_names(arch),
        flops=int(cost.flops),
        params=int(cost.params),
        search_accuracy=float(search_accuracy),
        arrays=arrays,
    )
    if num_rounds > 0:
        # Trained from scratch (rand-init, random search): the rand-init lr if one is set.
        base_lr = s.finetune.lr if init == SUPERNET_INIT else s.rand_init_lr or s.finetune.lr
        final_lr = base_lr * s.finetune_lr_decay

        def lr_at(r: int) -> float:
            if s.finetune_lr_schedule == "step":
                return step_lr(base_lr, r, num_rounds)
            return cosine_lr(base_lr, final_lr, r, num_rounds)

        fedavg = SeededFedAvg(
            nodes=nodes,
            seed=federation.seed,
            stage=stage,
            ledger=federation.ledger,
            clients_per_round=per_round,
            min_replies=min(federation.min_replies, len(nodes)),
            train_message_type=FEDORAS_TRAIN,
            round_config=lambda r: {"lr": lr_at(r)},
            fraction_evaluate=0.0,
            aggregation=federation.aggregation,
            round_lines_every=30.0,  # one line per job (below), more only for long jobs
        )
        with federation.ledger.timed(stage):
            outcome = fedavg.start(
                grid,
                arrays,
                num_rounds=num_rounds,
                timeout=federation.reply_timeout,
                train_config=federation.with_user_config(FEDORAS_TRAIN, config),
                evaluate_fn=_server_curve(space.spec, arch, curve_data, calibration),
            )
        model.arrays = outcome.arrays
        model.history = [
            {
                "round": r,
                "lr": lr_at(r),
                **dict(outcome.train_metrics_clientapp.get(r, {})),
                **dict(outcome.evaluate_metrics_serverapp.get(r, {})),
            }
            for r in range(1, num_rounds + 1)
        ]
    model.test = test_subnet(context, grid, model.arrays, nodes, config, f"test-{stage}")
    trained = f"{num_rounds} rounds x {min(per_round or len(nodes), len(nodes))}/{len(nodes)} nodes"
    last = model.history[-1] if model.history else {}
    if "val-accuracy" in last:
        trained += f", val-accuracy {fmt(last['val-accuracy'])}"
    log(
        INFO,
        "[%s] %s %s: %s; test accuracy %s (worst client %s) | %s",
        stage,
        "-".join(model.names),
        describe_flops(model.flops),
        trained,
        fmt(model.test.accuracy),
        fmt(model.test.client_worst),
        format_seconds(time.perf_counter() - started),
    )
    return model


def random_search_tier(
    context: StageContext,
    grid: Grid,
    tier: Tier,
    budget: float,
    *,
    server_data: TensorDataset | None = None,
    cost: PathCost | None = None,
    placement: PathCost | None = None,
) -> TierModel:
    """The random-search baseline of one tier, at a given client compute.

    ``random-search-paths`` distinct random paths inside the tier are each
    trained from a random initialisation with the Stage-3 FedAvg recipe on the
    tier's eligible clients, for as many rounds as ``budget / paths`` client
    training FLOPs pay for (at least one).  The winner is the best on the
    server's validation slice after training (without one: the lowest final
    training loss); its test result is the baseline's.  ``cost``: what the tier
    bounds (default: FLOPs; ``placement``: what its lower bound is measured on,
    ``search.TierBound``).
    """
    s = context.settings
    space = context.space
    nodes = context.eligible(tier.index)
    rng = context.federation.rng("random-search", tier.index)
    paths = initial_paths(space, tier, rng, s.random_search_paths, cost=cost, placement=placement)
    per_client = np.mean([p.num_train for p in nodes]) * s.finetune.local_epochs
    clients = min(s.finetune.clients_per_round, len(nodes))
    candidates = []
    for candidate, path in enumerate(paths):
        per_round = clients * training_flops(int(space.cost(path).flops), int(per_client))
        rounds = max(1, int(budget / len(paths) // max(per_round, 1)))
        model = finetune_tier(
            context,
            grid,
            ArrayRecord(),
            tier.index,
            path,
            math.nan,
            init=RANDOM_SEARCH,
            server_data=server_data,
            rounds=rounds,
            candidate=candidate,
        )
        last = model.history[-1] if model.history else {}
        model.search_accuracy = float(last.get("val-accuracy", math.nan))
        score = last.get("val-accuracy", -float(last.get("train-loss", math.inf)))
        candidates.append((float(score), -candidate, model))
        log(
            INFO,
            "[random search] tier %d candidate %d: %d rounds",
            tier.index + 1,
            candidate,
            rounds,
        )
    return max(candidates, key=lambda c: (c[0], c[1]))[2]


def test_subnet(
    context: StageContext,
    grid: Grid,
    arrays: ArrayRecord,
    nodes: Sequence[NodeProfile],
    config: dict[str, Any],
    stage: str,
) -> TierTest:
    """Test ``arrays`` on every connected node of ``nodes`` with test data."""
    federation = context.federation
    connected = set(grid.get_node_ids())
    targets = sorted(
        (p for p in nodes if p.node_id in connected and p.num_test > 0),
        key=lambda p: p.partition_id,
    )
    messages = [
        Message(
            RecordDict({ARRAYS: arrays, CONFIG: ConfigRecord(config)}),
            message_type=FEDORAS_EVALUATE,
            dst_node_id=p.node_id,
        )
        for p in targets
    ]
    replies = federation.accept(
        stage,
        federation.exchange(grid, stage, messages),
        lambda r: (
            check_reply(
                r,
                counts=("num-examples", "correct", "loss-sum"),
                bounds={
                    "num-examples": federation.claim(
                        r.metadata.src_node_id, "test", per_sample=context.predictions_per_sample
                    )
                },
            )
            or _check_test_reply(r)
        ),
    )
    federation.require(stage, len(replies), len(messages), at_most_sent=True)
    correct = [int(r.content.metric_records[METRICS]["correct"]) for r in replies]
    counts = [int(r.content.metric_records[METRICS]["num-examples"]) for r in replies]
    loss_sum = sum(float(r.content.metric_records[METRICS]["loss-sum"]) for r in replies)
    per_client = np.asarray(correct) / np.asarray(counts)
    loss = loss_sum / sum(counts)
    return TierTest(
        accuracy=sum(correct) / sum(counts),
        loss=loss,
        examples=sum(counts),
        clients=len(replies),
        client_mean=float(per_client.mean()),
        client_std=float(per_client.std()),
        client_worst=float(per_client.min()),
        perplexity=math.exp(min(loss, 700.0)) if context.space.spec["name"] == "rnn" else None,
    )


def _check_test_reply(reply: Message) -> str | None:
    metrics = reply.content.metric_records[METRICS]
    if int(metrics["num-examples"]) < 1:
        return "num-examples is 0"
    if metrics["correct"] > metrics["num-examples"]:
        return "more correct predictions than examples"
    return None
