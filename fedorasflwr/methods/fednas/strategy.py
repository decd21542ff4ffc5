"""FedNAS (He, Annavaram and Avestimehr, "FedNAS: Federated Deep Learning via Neural
Architecture Search", CVPR-W 2020; FedML's ``fednas``): federated DARTS.

Every round the sampled clients (default: all) download the supernet weights w and
architecture parameters alpha, run ``local-epochs`` epochs of first-order DARTS on their
data (a weight step on a training batch, an alpha step on a validation batch; Adam on
alpha) and return both; the server averages both, weighted by the clients' training
sample counts (FedAvg), in partition-id order.  FedML's server returns client 0's alphas
instead of their average (docs/fednas.md); here the alphas are averaged like the weights.
After the search the genotype is derived (DARTS: top-2 inputs per node, as DP-FNAS) and
the derived network is trained with FedAvg (``SeededFedAvg``) and tested on the
clients' test splits.

Client contract
---------------
``query.profile``
    config: ``method``.  Reply: ConfigRecord ``profile`` (see ``NodeProfile``).
``train.fednas_search``
    arrays: the whole supernet ``state_dict`` (w and alpha).  config: ``method``,
    ``phase`` ("search"), ``server-round``, ``seed``, ``local-epochs``, ``batch-size``,
    ``lr``, ``momentum``, ``weight-decay``, ``arch-lr``, ``arch-weight-decay``,
    ``mixed-flops`` (forward FLOPs of one sample through the mixed supernet) and
    ``space.<kwarg>``.  Reply: ArrayRecord ``arrays`` with every key sent; MetricRecord
    ``metrics`` with ``num-examples`` (training samples N_k), ``train-loss``, ``val-loss``,
    ``train-flops`` (3 x ``mixed-flops`` per sample of its weight and architecture steps;
    a whole number, booked in the ledger's search stage).
``train.fednas_final`` / ``evaluate.fednas_final``
    arrays: the derived network's ``state_dict``. config: ``genotype``
    (``Genotype.to_text``), ``net-flops`` (its forward FLOPs per sample),
    ``space.<kwarg>``, ``local-epochs``, ``batch-size``, ``lr``, ``momentum``, ``seed``,
    ``server-round``.  Reply: the trained arrays and ``num-examples``, ``train-loss``,
    ``train-flops`` (``LocalTraining.flops``; booked in the ledger's final stage); or
    ``num-examples``, ``loss``, ``accuracy`` on the test split.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from logging import INFO
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result
from flwr.supercore import log

from ...arrays import record_of, state_dict_of
from ...checkpoints import Resume
from ...costs import flops_to_macs, training_flops
from ...federation.aggregation import Aggregation, opa
from ...federation.base import FederatedNASStrategy, NodeProfile, sample_nodes
from ...federation.fedavg import SeededFedAvg, trained_rounds
from ...federation.replies import ArraySpec, Bound, array_specs, check_reply, check_whole
from ...progress import StageClock, fmt
from ...protocol import ARRAYS, CONFIG, METRICS, space_to_config
from ...search_spaces.base import SearchSpace
from ...search_spaces.darts import genotype_cost
from ...search_spaces.darts_style import mixed_flops, network_flops, require_darts_style
from ...search_spaces.importable import require_importable
from ...seeding import seed_torch
from .messages import FEDNAS_EVALUATE, FEDNAS_SEARCH, FEDNAS_TRAIN
from .settings import FedNASSettings

__all__ = ["FedNAS", "FedNASResult", "alpha_entropy", "genotype_cost"]

SEARCH, FINAL = "search", "final"
SEARCH_COUNTS = ("num-examples", "train-flops")


@dataclass(kw_only=True, repr=False)
class FedNASResult(Result):
    """What ``FedNAS.start`` returns: Flower's ``Result`` (``arrays``: the searched supernet,
    w and alpha; per round the aggregated training metrics), the genotype, the search
    history (alpha entropy per round) and the derived network's FedAvg and test."""

    genotype: Any  # the space's genotype(): ``Genotype`` for darts; has ``to_text()``
    rounds: int
    history: list[dict[str, Any]] = field(default_factory=list)
    # the derived network's forward FLOPs / MACs (its path in the supernet; None: no path)
    flops: int | None = None
    macs: float | None = None
    final_arrays: ArrayRecord | None = None
    final_history: list[dict[str, Any]] = field(default_factory=list)
    test_accuracy: float | None = None
    # the derived net on the server's global test set (data.global-test; set by the app's
    # runner, runs.GlobalTest) and the set's samples
    global_test_accuracy: float | None = None
    global_test_count: int | None = None
    ledger: dict[str, Any] = field(default_factory=dict)


def alpha_entropy(space: SearchSpace) -> dict[str, float]:
    """Mean entropy (nats) of ``softmax(alpha)`` over the rows of each architecture
    variable of ``space``: ``ln(options)`` while uniform, 0 once every row is decided."""
    state = space.state_dict()
    entropy = {}
    for key in space.arch_keys:  # type: ignore[attr-defined]
        p = torch.softmax(state[key].detach().float(), dim=-1)
        rows = -(p * torch.log(p.clamp_min(1e-12))).sum(dim=-1)
        entropy[key] = round(float(rows.mean()), 6)
    return entropy


class FedNAS(FederatedNASStrategy[FedNASResult]):
    """FedNAS: FedAvg of local DARTS searches (weights and alphas), derivation, FedAvg.

    Parameters
    ----------
    space : SearchSpace
        The supernet, DARTS-style (``search_spaces.darts_style``; ``darts`` is the
        built-in); its weights and alphas are the initial global model.
    settings : FedNASSettings
        Hyper-parameters (paper values in its docstring).
    seed : int
        Fixes client sampling, the clients' batch orders and the derived net's init.
    validate_profiles : callable, optional
        Called with the profiles before any work; raise to stop.
    resume : Resume, optional
        A checkpoint: the search continues after its last round; taken after the search,
        the genotype is derived again and the derived network trained again.
    min_nodes
        See ``FederatedNASStrategy``.
    evaluate_fn : callable, optional
        ``(round, arrays) -> MetricRecord``: server-side validation of the supernet every
        ``settings.eval_every`` rounds and after the last.
    """

    rounds_setting = "search.rounds"

    def __init__(
        self,
        *,
        space: SearchSpace,
        settings: FedNASSettings,
        seed: int,
        validate_profiles: Callable[[Sequence[NodeProfile]], None] | None = None,
        resume: Resume | None = None,
        min_nodes: int = 1,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> None:
        require_darts_style(space, "FedNAS")
        require_importable(space, "FedNAS")
        super().__init__(seed=seed, min_replies=settings.min_replies, min_nodes=min_nodes)
        self.space = space
        self.settings = settings
        self.resume = resume
        self.validate_profiles = validate_profiles
        self.evaluate_fn = evaluate_fn
        # how every aggregation combines a key's updates (settings.aggregation_rule)
        self.aggregation = Aggregation.of(settings)
        self._current = ArrayRecord()
        self._specs: dict[str, ArraySpec] = {}
        self._sent: set[int] = set()
        self._mixed_flops: int | None = None

    @property
    def mixed_flops(self) -> int:
        """Forward FLOPs of one sample through the mixed supernet (every edge runs every
        op), counted once: what a search step costs per sample, forward only."""
        if self._mixed_flops is None:
            self._mixed_flops = mixed_flops(self.space)
        return self._mixed_flops

    def flops_bound(self, node_id: int) -> Bound:
        """The most ``train-flops`` a search reply of ``node_id`` can honestly claim: per
        local epoch every training sample once plus one validation batch (at most
        ``batch-size`` samples) per training batch, each at 3 x ``mixed-flops``."""
        profile = self.profiles.get(node_id)
        if profile is None:
            return Bound(0, f"node {node_id} was never profiled")
        s = self.settings.search
        steps = -(-profile.num_train // s.batch_size)
        samples = s.local_epochs * (profile.num_train + steps * min(s.batch_size, profile.num_val))
        return Bound(
            training_flops(self.mixed_flops, samples),
            f"3 x mixed-flops {self.mixed_flops} x {samples} samples (num-train "
            f"{profile.num_train}, num-val {profile.num_val}, {s.local_epochs} epoch(s))",
        )

    def summary(self) -> None:
        s = self.settings.search
        log(
            INFO,
            "\t├── FedNAS: %d rounds, %s clients/round, %d local epoch(s), batch %d",
            s.rounds,
            s.clients_per_round or "all",
            s.local_epochs,
            s.batch_size,
        )
        log(
            INFO,
            "\t└── w: SGD lr %g momentum %g; alpha: Adam lr %g; final %d round(s)",
            s.lr,
            s.momentum,
            self.settings.arch_lr,
            self.settings.final.rounds,
        )

    def setup(self, grid: Grid) -> None:
        """Profile the nodes (every profiled node is a client)."""
        self.profile_nodes(grid, ConfigRecord({"method": "fednas"}))

    # --- one search round --------------------------------------------------------------

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Sample the round's clients (``clients-per-round``, 0: all); send each the
        whole supernet (w and alpha)."""
        s = self.settings
        connected = self.connected_profiles(grid)  # nodes profiled mid-run join here
        chosen = sample_nodes(
            self.rng(SEARCH, "sample", server_round),
            connected,
            s.search.clients(len(connected)),
        )
        self._current = arrays
        self._specs = array_specs(arrays)
        self._sent = {p.node_id for p in chosen}
        message_config = ConfigRecord(
            {
                **dict(config),
                "method": "fednas",
                "phase": SEARCH,
                "server-round": server_round,
                "seed": self.seed,
                **s.search.client_config(),
                "arch-lr": s.arch_lr,
                "arch-weight-decay": s.arch_weight_decay,
                "mixed-flops": self.mixed_flops,
                **space_to_config(self.space.spec),
            }
        )
        messages = [
            Message(
                content=RecordDict({ARRAYS: arrays, CONFIG: message_config}),
                message_type=FEDNAS_SEARCH,
                dst_node_id=p.node_id,
            )
            for p in chosen
        ]
        return self.instruct("train", SEARCH, server_round, messages)

    def check_train_reply(self, reply: Message) -> str | None:
        """Why a search reply is unusable, or ``None``."""
        if reply.metadata.src_node_id not in self._sent:
            return "reply from a node that was not asked"
        node = reply.metadata.src_node_id
        reason = check_reply(
            reply,
            sent=self._specs,
            counts=SEARCH_COUNTS,
            bounds={
                "num-examples": self.claim(node, "train"),
                "train-flops": self.flops_bound(node),
            },
        ) or check_whole(reply.content.metric_records[METRICS], ("train-flops",))
        if reason is not None:
            return reason
        if int(reply.content.metric_records[METRICS]["num-examples"]) < 1:
            return "num-examples is 0"
        if set(reply.content.array_records[ARRAYS].keys()) != set(self._specs):
            return "the reply does not carry every supernet key (w and alpha)"
        return None

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """w and alpha <- sum_k N_k / N (w_k, alpha_k) over the accepted replies, in
        partition-id order (FedML averages w only and keeps client 0's alpha)."""
        accepted = self.accept(
            SEARCH, self.screened(SEARCH, "train", replies), self.check_train_reply
        )
        self.require(SEARCH, len(accepted), len(self._sent), at_most_sent=True)
        updates, totals, examples = [], {"train-loss": 0.0, "val-loss": 0.0}, 0
        for reply in accepted:
            metrics = reply.content.metric_records[METRICS]
            n = int(metrics["num-examples"])
            self.ledger.node(SEARCH, reply.metadata.src_node_id).train_flops += int(
                metrics["train-flops"]
            )
            updates.append((reply.content.array_records[ARRAYS], n))
            for key in totals:
                totals[key] += float(metrics.get(key, 0.0)) * n
            examples += n
        arrays = opa(self._current, updates, min_contributors=1, aggregation=self.aggregation)
        return arrays, MetricRecord(
            {
                **{key: value / examples for key, value in totals.items()},
                "num-examples": examples,
                "clients": len(accepted),
            }
        )

    # --- the whole method ----------------------------------------------------------------

    def run(self, grid: Grid, initial_arrays: ArrayRecord) -> FedNASResult:
        """Search, derive the genotype, train the derived network with FedAvg, test it.

        Flower's parameters: ``initial_arrays`` initialise the supernet (an empty
        ``ArrayRecord``: the space's own); ``num_rounds`` is the number of search rounds;
        ``timeout`` the reply timeout; ``train_config`` / ``evaluate_config`` travel in
        every ``train.*`` / ``evaluate.*`` message; ``evaluate_fn(round, supernet)``
        validates the supernet every ``settings.eval_every`` rounds and after the last."""
        log(INFO, "Starting FedNAS")
        self.summary()
        resume = self.resume
        if resume is not None:
            self.ledger.restore(resume.ledger)
        with self.ledger.timed("setup"):
            self.setup(grid)
        arrays = initial_arrays if len(initial_arrays) else record_of(self.space.state_dict())
        rounds = self.settings.search.rounds
        history: list[dict[str, Any]] = []
        done = 0
        if resume is not None:
            arrays, history = resume.arrays, [dict(h) for h in resume.history]
            done = resume.step if resume.within(SEARCH) else rounds
            log(INFO, "FedNAS resumed after round %d (%s)", done, resume.path)
        self.reached(SEARCH, done)
        clock = StageClock("FedNAS", rounds, done + 1)
        for server_round in range(done + 1, rounds + 1):
            started = time.perf_counter()
            messages = list(self.configure_train(server_round, arrays, ConfigRecord(), grid))
            replies = self.exchange(grid, SEARCH, messages)
            new_arrays, metrics = self.aggregate_train(server_round, replies)
            arrays = new_arrays if new_arrays is not None else arrays
            if metrics is not None:
                self.train_metrics[server_round] = metrics
            self.space.load_state_dict(state_dict_of(arrays))
            entry = {
                "sent": len(messages),
                **dict(metrics or {}),
                "genotype": self.space.genotype().to_text(),
                "alpha-entropy": alpha_entropy(self.space),
                "seconds": round(time.perf_counter() - started, 4),
            }
            self.record_step(
                server_round,
                arrays,
                history,
                entry,
                every=self.settings.eval_every,
                last=server_round == rounds,
            )
            log(INFO, "%s", clock.line(server_round, metrics))
            self.reached(
                SEARCH, server_round, arrays, history=history, stage_done=server_round == rounds
            )
        self.space.load_state_dict(state_dict_of(arrays))
        genotype = self.space.genotype()
        log(INFO, "FedNAS genotype: %s", genotype.to_text())
        flops = genotype_cost(self.space, genotype)
        result = FedNASResult(
            arrays=arrays,
            genotype=genotype,
            rounds=rounds,
            history=history,
            flops=flops,
            macs=None if flops is None else flops_to_macs(flops),
        )
        self.contract_result(result, arrays)
        if self.settings.final.rounds > 0:
            self.reached(FINAL, 0)
            self.train_final(grid, result)
            self.reached(
                FINAL,
                self.settings.final.rounds,
                arrays,
                history=history,
                stage_done=True,
                final_history=result.final_history,
            )
        result.ledger = self.ledger.summary()
        return result

    def train_final(self, grid: Grid, result: FedNASResult) -> None:
        """FedAvg of the derived network over the clients; test accuracy from their test splits."""
        s = self.settings
        spec = {k: v for k, v in self.space.spec.items() if k != "name"}
        seed_torch(self.seed, "final-init")  # a resumed run draws the same init
        net = type(self.space).derived_network(result.genotype.to_text(), **spec)
        clients = sorted(self.profiles.values(), key=lambda p: p.partition_id)
        fedavg = SeededFedAvg(
            nodes=clients,
            seed=self.seed,
            stage=FINAL,
            ledger=self.ledger,
            clients_per_round=s.final.clients_per_round or len(clients),
            min_replies=s.min_replies,
            train_message_type=FEDNAS_TRAIN,
            evaluate_message_type=FEDNAS_EVALUATE,
            train_counts=("train-flops",),
            min_evaluate_nodes=1,
            aggregation=self.aggregation,
        )
        config = ConfigRecord(
            {
                "method": "fednas",
                "phase": FINAL,
                "seed": self.seed,
                "genotype": result.genotype.to_text(),
                # the derived net's forward FLOPs per sample (clients report train-flops)
                "net-flops": result.flops
                if result.flops is not None
                else network_flops(net, self.space),
                **s.final.client_config(),
                **space_to_config(self.space.spec),
            }
        )
        with self.ledger.timed(FINAL):
            outcome = fedavg.start(
                grid,
                record_of(net.state_dict()),
                num_rounds=s.final.rounds,
                timeout=self.reply_timeout,
                train_config=self.with_user_config(FEDNAS_TRAIN, config),
                evaluate_config=self.with_user_config(FEDNAS_EVALUATE, config),
            )
        trained = trained_rounds(outcome, s.final.rounds)
        result.final_arrays, result.final_history = trained.arrays, trained.history
        result.test_accuracy = trained.test_accuracy
        log(INFO, "FedNAS derived network: test accuracy %s", fmt(result.test_accuracy))
