"""DP-FNAS (Singh et al., "Differentially-private Federated Neural Architecture
Search", FL-ICML 2020): federated DARTS with private gradient exchanges.

The server holds the weights W and architecture variables A of a DARTS-style
space (``darts``, or any space of ``search_spaces.darts_style`` that passes the
per-sample-gradient check of ``per_sample.py``); every node is a party.  One
iteration is two exchanges (Algorithm 1):

(a) each party sends G_k, its Poisson-subsampled, per-sample-clipped (R_G),
    Gaussian-noised (R_G sigma) training gradient of W; the server steps
    ``W <- W - xi * agg_k G_k`` (``agg``: the paper's sum, or the mean);
(b) each party sends H_k, the same on its validation split for A (clip R_H,
    noise R_H tau; first order or the paper's second-order estimate, Eq. 5);
    the server steps ``A <- A - eta * agg_k H_k``.

Privacy is accounted per party after every iteration (``privacy.py``); a
target epsilon stops the search before it would be exceeded.  After the
search the genotype is derived (top-2 inputs per node; with ``dpfnas.resource =
"latency"`` made to fit ``dpfnas.latency-budget-ms`` on the parties' latency tables,
``budget.py``), the derived network is trained with FedAvg (``SeededFedAvg``) and tested
on the parties' test splits.

Client contract
---------------
``query.profile``
    See ``NodeProfile``.
``train.dpfnas_weights`` / ``train.dpfnas_arch``
    arrays: the full ``state_dict`` (W and A; for ``order`` 2 the arch message
    also carries the previous W under ``previous.<key>``).  config: ``method``,
    ``phase``, ``server-round``, ``seed``, ``sample-rate``, ``clip``,
    ``noise-multiplier``, ``order``, ``weight-lr``, ``insecure-reproducible-noise``,
    ``mixed-flops`` (forward FLOPs of one sample through the mixed supernet) and
    ``space.<kwarg>``.
    Reply: ArrayRecord ``arrays`` with exactly the W keys (weights) or the A
    keys (arch), the noised gradient; MetricRecord ``metrics`` with
    ``expected-batch`` (p N_k, public), ``train-flops`` (3 x ``mixed-flops`` per sample
    pass, a whole number; a private party's from the expected batch, see ``client.py``;
    booked in the ledger's stage of the exchange) and, without noise only,
    ``clipped-fraction``.
``train.dpfnas_final`` / ``evaluate.dpfnas_final``
    arrays: the derived network's ``state_dict``. config: ``genotype``
    (``Genotype.to_text``), ``space.<kwarg>``, ``local-epochs``,
    ``batch-size``, ``lr``, ``momentum``, ``seed``, ``server-round``,
    ``noise-multiplier`` and ``clip`` (> 0: local DP-SGD, Poisson batches),
    ``insecure-reproducible-noise``, ``net-flops`` (the derived net's forward FLOPs per
    sample).
    Reply: the trained arrays and ``num-examples``, ``train-loss``, ``train-flops``; or
    ``num-examples``, ``loss``, ``accuracy`` on the test split.

A party whose node config lacks ``allow-reproducible-noise = true`` refuses (an error
reply, booked as its failure) every noised message with ``insecure-reproducible-noise``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from logging import INFO, WARNING
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result
from flwr.supercore import log
from torch.utils.data import TensorDataset

from ...arrays import record_of, state_dict_of
from ...checkpoints import Resume
from ...costs import training_flops
from ...federation.aggregation import Aggregation
from ...federation.base import FederatedNASStrategy, NodeProfile, ProfileRules
from ...federation.fedavg import SeededFedAvg, trained_rounds
from ...federation.replies import Bound, array_specs, check_reply, check_whole
from ...latency import LatencyRequest, LatencyTable, group_table
from ...progress import StageClock, fmt
from ...protocol import ARRAYS, CONFIG, METRICS, space_to_config
from ...search_spaces.base import SearchSpace
from ...search_spaces.darts_style import (
    mixed_flops,
    network_flops,
    require_darts_style,
    weight_keys,
)
from ...search_spaces.importable import require_importable
from ...seeding import seed_torch
from .budget import budgeted_genotype, cheapest_ms, genotype_ms, require_darts_layout
from .contract import (
    DPFNAS_ARCH,
    DPFNAS_EVALUATE,
    DPFNAS_TRAIN,
    DPFNAS_WEIGHTS,
    INSECURE_KEY,
    PREVIOUS_PREFIX,
    final_steps,
)
from .evaluation import MixedSupernetEvaluator
from .per_sample import per_sample_problem
from .privacy import Accountant, PartyPrivacy, Segment, add_steps
from .settings import DPFNASSettings

__all__ = ["DPFNAS", "DPFNASResult", "json_safe", "privacy_report", "restore_history"]

WEIGHTS, ARCH, FINAL = "weights", "arch", "final"
SEARCH = "search"


@dataclass(kw_only=True, repr=False)
class DPFNASResult(Result):
    """What ``DPFNAS.start`` returns: Flower's ``Result`` (``arrays``: the searched
    supernet W and A; per search iteration the aggregated gradient metrics and
    ``evaluate_fn``'s), the genotype, the privacy report and the final network."""

    genotype: Any  # the space's genotype(): ``Genotype`` for darts; has ``to_text()``
    iterations: int
    stopped: str
    privacy: list[PartyPrivacy]
    history: list[dict[str, Any]] = field(default_factory=list)
    final_arrays: ArrayRecord | None = None
    final_history: list[dict[str, Any]] = field(default_factory=list)
    test_accuracy: float | None = None
    # the derived net on the server's global test set (data.global-test; set by the app's
    # runner, runs.GlobalTest) and the set's samples
    global_test_accuracy: float | None = None
    global_test_count: int | None = None
    final_privacy: list[dict[str, Any]] = field(default_factory=list)
    ledger: dict[str, Any] = field(default_factory=dict)
    noise: dict[str, Any] = field(default_factory=dict)
    # dpfnas.resource = "latency": the budgeted derivation and every party's table
    latency: dict[str, Any] = field(default_factory=dict)
    latency_tables: dict[int, LatencyTable] = field(default_factory=dict)


class DPFNAS(FederatedNASStrategy[DPFNASResult]):
    """DP-FNAS search (two private exchanges per iteration), derivation and final training.

    Parameters
    ----------
    space : SearchSpace
        The supernet, DARTS-style (``search_spaces.darts_style``: ``arch_keys``,
        ``genotype()``, ``derived_network``, a mixed ``forward(x)``) and passing the
        per-sample-gradient check (``per_sample.per_sample_problem``), else
        ``ValueError`` saying why; ``darts`` is the built-in.  Its weights and
        architecture variables are the initial W and A.
    settings : DPFNASSettings
        Hyper-parameters (paper values in its docstring).
    seed : int
        Fixes the final sampling and, only with ``insecure_reproducible_noise`` (or
        without noise), the parties' samples and noise; private parties draw those
        from their OS CSPRNG (``clients/secure_random.py``).
    evaluate_fn : callable, optional
        ``(iteration, arrays) -> MetricRecord``: server-side validation of the
        mixed supernet every ``eval_every`` iterations and after the last
        (``start``'s ``evaluate_fn``, when given, replaces it). Default: with
        ``server_data``, ``MixedSupernetEvaluator`` on it; else none.
    server_data : TensorDataset, optional
        A server-held validation slice for the default ``evaluate_fn`` (no party's
        data: validating on it spends no privacy budget).
    validate_profiles : callable, optional
        Called with the profiles before any work; raise to stop.
    resume : Resume, optional
        A checkpoint: the search continues at the iteration after its last, with the
        saved server momentum, previous W and accountant steps; taken after the
        search, the final network is derived and trained again.
    min_nodes
        See ``FederatedNASStrategy``.
    latency_request : LatencyRequest, optional
        How the parties measure their latency tables (``settings.resource = "latency"``:
        the darts space only).

    The final training takes its parameters from ``settings`` (``final_rounds``, ...).
    """

    rounds_setting = "iterations"

    def __init__(
        self,
        *,
        space: SearchSpace,
        settings: DPFNASSettings,
        seed: int,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
        validate_profiles: Callable[[Sequence[NodeProfile]], None] | None = None,
        resume: Resume | None = None,
        min_nodes: int = 1,
        server_data: TensorDataset | None = None,
        latency_request: LatencyRequest | None = None,
    ) -> None:
        require_darts_style(space)
        require_importable(space, "DP-FNAS")
        if settings.resource == "latency":
            require_darts_layout(space)
        problem = per_sample_problem(space)
        if problem is not None:
            raise ValueError(
                f"DP-FNAS cannot take the space {space.spec['name']!r}: its per-sample "
                f"gradients would be wrong ({problem})"
            )
        super().__init__(seed=seed, min_replies=settings.min_replies, min_nodes=min_nodes)
        self.resume = resume
        self.space = space
        self.settings = settings
        # how every aggregation combines a key's updates (settings.aggregation_rule)
        self.aggregation = Aggregation.of(settings)
        self.evaluate_fn = evaluate_fn
        if evaluate_fn is None and server_data is not None and len(server_data):
            self.evaluate_fn = MixedSupernetEvaluator(space, server_data)
        self.validate_profiles = validate_profiles
        self.weight_keys = weight_keys(space)
        self.arch_keys = tuple(space.arch_keys)
        self.parties: list[NodeProfile] = []
        self.steps: dict[int, dict[str, int]] = {}
        # per party and mechanism: the (noise, rate, steps) segments its steps were taken at
        self.accounts: dict[int, dict[str, list[Segment]]] = {}
        self.accountant = Accountant(settings.accountant, settings.delta)
        self._momentum: dict[str, np.ndarray] = {}
        self._previous: ArrayRecord | None = None
        self._sent: dict[int, dict[str, Any]] = {}
        self._expected_batch: dict[int, Bound] = {}
        self._flops_bound: dict[int, Bound] = {}
        self._mixed_flops: int | None = None
        self._phase = WEIGHTS
        self.latency_request = latency_request
        self.group_latency: LatencyTable | None = None  # the parties' group table
        self.latency: dict[str, Any] = {}  # the budgeted derivation (result.json)

    @property
    def mixed_flops(self) -> int:
        """Forward FLOPs of one sample through the mixed supernet (every edge runs every
        op), counted once: a search exchange's cost per sample, forward only."""
        if self._mixed_flops is None:
            self._mixed_flops = mixed_flops(self.space)
        return self._mixed_flops

    def flops_bound(self, party: NodeProfile, phase: str) -> Bound:
        """The most ``train-flops`` a party's reply in ``phase`` can honestly claim: every
        sample of its split differentiated once (weights: num-train; arch: num-val, and at
        order 2 per validation sample twice the whole training split), 3 x mixed-flops."""
        if phase == WEIGHTS:
            passes, basis = party.num_train, f"num-train {party.num_train}"
        elif self.settings.order == 2:
            passes = party.num_val * (1 + 2 * party.num_train)
            basis = f"num-val {party.num_val} x (1 + 2 x num-train {party.num_train})"
        else:
            passes, basis = party.num_val, f"num-val {party.num_val}"
        return Bound(
            training_flops(self.mixed_flops, passes),
            f"3 x mixed-flops {self.mixed_flops} x {basis} sample passes",
        )

    @property
    def sigma(self) -> float:
        return self.settings.noise_weights if self.settings.noisy else 0.0

    @property
    def tau(self) -> float:
        return self.settings.noise_arch if self.settings.noisy else 0.0

    def summary(self) -> None:
        s = self.settings
        log(INFO, "\t├── DP-FNAS (%s): %d iterations, batch %d", s.mode, s.iterations, s.batch_size)
        log(INFO, "\t├── W: xi %g, R_G %g, sigma %g", s.weight_lr, s.clip_weights, self.sigma)
        log(
            INFO,
            "\t└── A: eta %g, R_H %g, tau %g, order %d",
            s.arch_lr,
            s.clip_arch,
            self.tau,
            s.order,
        )

    # --- setup -----------------------------------------------------------------------

    def setup(self, grid: Grid) -> None:
        """Profile the nodes; every node is a party (only the first in mode "single")."""
        profiles = self.profile_nodes(grid, ConfigRecord({"method": "dpfnas"}))
        parties = sorted(profiles.values(), key=lambda p: (p.partition_id, p.node_id))
        if self.settings.mode == "single":
            if len(parties) > 1:
                log(
                    WARNING,
                    "mode 'single': using only partition %d of %d nodes",
                    parties[0].partition_id,
                    len(parties),
                )
            parties = parties[:1]
        self.parties = parties
        self.steps = {p.partition_id: {WEIGHTS: 0, ARCH: 0} for p in parties}
        self.accounts = {p.partition_id: {WEIGHTS: [], ARCH: []} for p in parties}
        if self.settings.resource == "latency":
            self.latency_budget([p.node_id for p in parties], grid)
        b = self.settings.batch_size
        small = [p for p in parties if b >= min(p.num_train, p.num_val)]
        if small:
            log(
                WARNING,
                "DP-FNAS: dpfnas.batch-size = %d >= the training or validation split of %d "
                "of %d parties (smallest: %d samples): their sample rate is capped at 1, so "
                "there is no subsampling amplification and epsilon is large; use fewer "
                "parties, a larger data.val-fraction or a smaller dpfnas.batch-size",
                b,
                len(small),
                len(parties),
                min(min(p.num_train, p.num_val) for p in small),
            )

    def profile_rules(self) -> ProfileRules:
        """The space's rules, and a validation split: a party without one is dropped
        (``num-val`` >= 1; a run where none has one needs ``data.val-fraction`` > 0)."""
        return replace(super().profile_rules(), min_val=1)

    def admit_late(self, profile: NodeProfile) -> str | None:
        """The parties are fixed at the start (each accounts its own privacy): a node
        profiled mid-run joins only as a party's partition, in place of its gone node."""
        if all(p.partition_id != profile.partition_id for p in self.parties):
            return f"partition {profile.partition_id} is not one of the run's parties"
        return None

    def current_parties(self, grid: Grid) -> list[NodeProfile]:
        """The parties, each under the node that holds its partition now (a node that took
        a gone party's partition over mid-run replaces it: ``refresh_profiles``)."""
        self.refresh_profiles(grid)
        holder = {p.partition_id: p for p in self.profiles.values()}
        self.parties = [holder.get(p.partition_id, p) for p in self.parties]
        return self.parties

    def latency_budget(self, nodes: list[int], grid: Grid) -> None:
        """The parties' latency tables (``query.latency``: timings of the supernet on zero
        inputs, no data, so nothing to account) and their group table; a budget no
        genotype meets on it stops the run here, before any training."""
        self.query_latency(grid, self.space, nodes=nodes, request=self.latency_request)
        spec = self.space.spec
        tables = [t for n in nodes if (t := self._table_of(n, spec)) is not None]
        if len(tables) < len(nodes):
            log(
                INFO,
                "DP-FNAS latency: %d of %d parties sent no table",
                len(nodes) - len(tables),
                len(nodes),
            )
        self.group_latency = group_table(tables)
        budget = self.settings.latency_budget_ms
        low = cheapest_ms(self.group_latency, list(self.space.net.reduction))
        if low > budget * (1 + 1e-9):
            raise ValueError(
                f"run config 'dpfnas.latency-budget-ms' = {budget}: no genotype of the space "
                f"fits in it on the parties' latency table; allowed: at least {low:.4g} (the "
                "cheapest genotype)"
            )
        log(INFO, "DP-FNAS latency budget %.4g ms (cheapest genotype %.4g ms)", budget, low)

    def derive(self) -> Any:
        """The genotype of the loaded alphas: DARTS's, or (resource latency) the one made to
        fit the budget on the parties' group table, recorded in ``latency``."""
        genotype = self.space.genotype()
        table = self.group_latency
        if table is None:
            return genotype
        reduction = list(self.space.net.reduction)
        net = self.space.net
        budget = self.settings.latency_budget_ms
        budgeted = budgeted_genotype(net.alpha_normal, net.alpha_reduce, table, reduction, budget)
        self.latency = {
            "budget-ms": budget,
            "predicted-ms": genotype_ms(budgeted, table, reduction),
            "unbudgeted-genotype": genotype.to_text(),
            "unbudgeted-ms": genotype_ms(genotype, table, reduction),
            "cheapest-ms": cheapest_ms(table, reduction),
        }
        log(
            INFO,
            "DP-FNAS genotype within %.4g ms: predicted %.4g ms (unbudgeted: %.4g ms)",
            budget,
            self.latency["predicted-ms"],
            self.latency["unbudgeted-ms"],
        )
        return budgeted

    def sample_rates(self, party: NodeProfile) -> tuple[float, float]:
        """Poisson rates p = B / N on the training and validation split (capped at 1)."""
        b = self.settings.batch_size
        return min(1.0, b / party.num_train), min(1.0, b / party.num_val)

    def expected_batch(self, party: NodeProfile, phase: str) -> Bound:
        """The ``expected-batch`` a party must report: its sample rate x its declared
        split size (training split for the weights, validation split for the alphas)."""
        rate_train, rate_val = self.sample_rates(party)
        rate, split, n = (
            (rate_train, "train", party.num_train)
            if phase == WEIGHTS
            else (rate_val, "val", party.num_val)
        )
        return Bound(max(rate * n, 1e-12), f"sample-rate {rate:.6g} x num-{split} {n}", exact=True)

    def privacy(self, extra_steps: int = 0) -> list[PartyPrivacy]:
        """Each party's guarantees after its steps so far, composed from its accounts
        (each step at the noise and rate it was taken with), plus ``extra_steps`` each at
        today's noise and rates; composed by the cached ``Accountant``."""
        report = []
        for party in self.parties:
            rate_train, rate_val = self.sample_rates(party)
            account = self.accounts[party.partition_id]
            report.append(
                PartyPrivacy.of(
                    party.partition_id,
                    weights=add_steps(account[WEIGHTS], self.sigma, rate_train, extra_steps),
                    arch=add_steps(account[ARCH], self.tau, rate_val, extra_steps),
                    account=self.accountant,
                    current=(self.sigma, self.tau, rate_train, rate_val),
                )
            )
        return report

    # --- one exchange ----------------------------------------------------------------

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """One message per connected party; ``config["phase"]`` is "weights" or "arch"."""
        phase = str(config["phase"])
        if phase not in (WEIGHTS, ARCH):
            raise ValueError(f"phase {phase!r}: expected {WEIGHTS!r} or {ARCH!r}")
        self._phase = phase
        s = self.settings
        connected = set(grid.get_node_ids())
        payload = ArrayRecord(dict(arrays.items()))
        if phase == ARCH and s.order == 2 and self._previous is not None:
            for key in self.weight_keys:
                payload[PREVIOUS_PREFIX + key] = self._previous[key]
        keys = self.weight_keys if phase == WEIGHTS else self.arch_keys
        specs = array_specs(ArrayRecord({k: arrays[k] for k in keys}))
        self._sent = {}
        self._expected_batch = {}
        self._flops_bound = {}
        messages = []
        for party in self.current_parties(grid):
            if party.node_id not in connected:
                log(WARNING, "[%s] party %d is not connected", phase, party.partition_id)
                continue
            rate_train, rate_val = self.sample_rates(party)
            self._sent[party.node_id] = specs
            self._expected_batch[party.node_id] = self.expected_batch(party, phase)
            self._flops_bound[party.node_id] = self.flops_bound(party, phase)
            self.steps[party.partition_id][phase] += 1
            account = self.accounts[party.partition_id]
            noise, rate = (self.sigma, rate_train) if phase == WEIGHTS else (self.tau, rate_val)
            account[phase] = add_steps(account[phase], noise, rate)
            message_config = ConfigRecord(
                {
                    **dict(config),
                    "method": "dpfnas",
                    "server-round": server_round,
                    "seed": self.seed,
                    "sample-rate": rate_train if phase == WEIGHTS else rate_val,
                    "clip": s.clip_weights if phase == WEIGHTS else s.clip_arch,
                    "noise-multiplier": self.sigma if phase == WEIGHTS else self.tau,
                    "order": s.order,
                    "weight-lr": s.weight_lr,
                    INSECURE_KEY: s.insecure_reproducible_noise,
                    "mixed-flops": self.mixed_flops,
                    **space_to_config(self.space.spec),
                }
            )
            messages.append(
                Message(
                    content=RecordDict({ARRAYS: payload, CONFIG: message_config}),
                    message_type=DPFNAS_WEIGHTS if phase == WEIGHTS else DPFNAS_ARCH,
                    dst_node_id=party.node_id,
                )
            )
        return self.instruct("train", phase, server_round, messages)

    def check_gradient_reply(self, reply: Message) -> str | None:
        """Why a gradient reply is unusable (wrong keys, shapes, non-finite), or ``None``."""
        specs = self._sent.get(reply.metadata.src_node_id)
        if specs is None:
            return "reply from a node that was not asked"
        node = reply.metadata.src_node_id
        reason = check_reply(
            reply,
            sent=specs,
            counts=("expected-batch", "train-flops"),
            bounds={
                "expected-batch": self._expected_batch[node],
                "train-flops": self._flops_bound[node],
            },
        ) or check_whole(reply.content.metric_records[METRICS], ("train-flops",))
        if reason is not None:
            return reason
        returned = set(reply.content.array_records[ARRAYS].keys())
        if returned != set(specs):
            return f"returned {len(returned)} gradient arrays, expected {len(specs)}"
        return None

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregate the accepted gradients (sum or mean over parties); no step here."""
        phase = self._phase
        accepted = self.accept(
            phase, self.screened(phase, "train", replies), self.check_gradient_reply
        )
        self.require(phase, len(accepted), len(self._sent))
        keys = list(next(iter(self._sent.values())))
        total = {k: np.zeros(self._sent_shape(k), dtype=np.float64) for k in keys}
        clipped = []
        for reply in accepted:
            arrays = reply.content.array_records[ARRAYS]
            for key in keys:
                total[key] += arrays[key].numpy().astype(np.float64)
            metrics = reply.content.metric_records[METRICS]
            self.ledger.node(phase, reply.metadata.src_node_id).train_flops += int(
                metrics["train-flops"]
            )
            if "clipped-fraction" in metrics:  # sent by non-private parties only
                clipped.append(float(metrics["clipped-fraction"]))
        if self.aggregation.robust:  # robust mean of the parties' gradients (x K for "sum")
            scale = 1 if self.settings.aggregation == "mean" else len(accepted)
            total = {
                k: scale
                * self.aggregation.combine(
                    [r.content.array_records[ARRAYS][k].numpy() for r in accepted],
                    [1.0] * len(accepted),
                    np.dtype(np.float64),
                )
                for k in keys
            }
        elif self.settings.aggregation == "mean":
            total = {k: v / len(accepted) for k, v in total.items()}
        gradient = record_of({k: v.astype(np.float32) for k, v in total.items()})
        record = MetricRecord({"parties": len(accepted)})
        if clipped:
            record["clipped-fraction"] = sum(clipped) / len(clipped)
        return gradient, record

    def _sent_shape(self, key: str) -> tuple[int, ...]:
        return next(iter(self._sent.values()))[key].shape

    def step(
        self, arrays: ArrayRecord, gradient: ArrayRecord, lr: float, momentum: float
    ) -> ArrayRecord:
        """SGD with heavy-ball momentum (0: the paper's plain step) on ``gradient``'s keys."""
        updated = ArrayRecord(dict(arrays.items()))
        for key, grad in gradient.items():
            value = grad.numpy().astype(np.float64)
            if momentum > 0:
                value = self._momentum.get(key, 0.0) * momentum + value
                self._momentum[key] = value
            weights = arrays[key].numpy().astype(np.float64) - lr * value
            updated[key] = Array(weights.astype(arrays[key].numpy().dtype))
        return updated

    def iterate(
        self, grid: Grid, iteration: int, arrays: ArrayRecord
    ) -> tuple[ArrayRecord, dict[str, Any]]:
        """One DP-FNAS iteration: exchange (a), step W; exchange (b), step A."""
        s = self.settings
        entry: dict[str, Any] = {}
        previous = arrays
        for phase, lr, momentum in (
            (WEIGHTS, s.weight_lr, s.weight_momentum),
            (ARCH, s.arch_lr, s.arch_momentum),
        ):
            messages = list(
                self.configure_train(iteration, arrays, ConfigRecord({"phase": phase}), grid)
            )
            replies = self.exchange(grid, phase, messages)
            gradient, metrics = self.aggregate_train(iteration, replies)
            arrays = self.step(arrays, gradient, lr, momentum)
            entry.update({f"{phase}-{k}": v for k, v in (metrics or {}).items()})
            if phase == WEIGHTS:
                self._previous = previous
        return arrays, entry

    # --- the whole method ----------------------------------------------------------------

    def run(self, grid: Grid, initial_arrays: ArrayRecord) -> DPFNASResult:
        """Search, derive the genotype, train the derived network, test it.

        Flower's parameters: ``initial_arrays`` are the initial W and A (an empty
        ``ArrayRecord``: the space's own); ``num_rounds`` is the number of search
        iterations, two private exchanges each (``settings.iterations`` is replaced by
        it; a privacy target may stop earlier); ``timeout`` the reply timeout;
        ``train_config`` / ``evaluate_config`` travel in every ``train.*`` /
        ``evaluate.*`` message (the strategy's own keys, e.g. the noise, win);
        ``evaluate_fn(iteration, supernet)`` validates the supernet every
        ``settings.eval_every`` iterations and after the last. The constructor's
        ``resume`` continues a checkpointed run."""
        resume = self.resume
        log(INFO, "Starting DP-FNAS")
        noise = self.noise_statement()
        if self.settings.insecure_reproducible_noise:
            log(WARNING, "DP-FNAS: %s", noise["statement"])
        self.summary()
        if resume is not None:
            self.ledger.restore(resume.ledger)
        with self.ledger.timed("setup"):
            self.setup(grid)
        arrays = initial_arrays if len(initial_arrays) else record_of(self.space.state_dict())
        history: list[dict[str, Any]] = []
        stopped = "completed"
        done = 0
        if resume is None:
            self._evaluate(0, arrays, history, {})
        else:
            arrays, history = resume.arrays, [dict(h) for h in resume.history]
            done = self.restore_progress(resume)
            if not resume.within(SEARCH):
                stopped = str(resume.progress.get("stopped", stopped))
            log(INFO, "DP-FNAS resumed after iteration %d (%s)", done, resume.path)
        self.reached(SEARCH, done)
        searched = resume is not None and not resume.within(SEARCH)
        end = done if searched else self.settings.iterations
        target = self.settings.target_epsilon
        clock = StageClock("DP-FNAS", self.settings.iterations, done + 1, label="iteration")
        for iteration in range(done + 1, end + 1):
            if target > 0:
                upcoming = max(p.epsilon for p in self.privacy(extra_steps=1))
                if upcoming > target:
                    stopped = (
                        f"privacy target reached: iteration {iteration} would bring a party to "
                        f"epsilon = {upcoming:.3f} > target {target:g} at delta = "
                        f"{self.settings.delta:g}; search stopped after {done} iteration(s)"
                    )
                    log(WARNING, "DP-FNAS: %s", stopped)
                    break
            started = time.perf_counter()
            arrays, entry = self.iterate(grid, iteration, arrays)
            self.train_metrics[iteration] = MetricRecord(
                {
                    k: v
                    for k, v in entry.items()
                    if isinstance(v, (int, float)) and not isinstance(v, bool)
                }
            )
            done = iteration
            report = self.privacy()
            entry.update(
                {
                    "epsilon": max(p.epsilon for p in report),
                    "mu-weights": max(p.weights.mu for p in report),
                    "mu-arch": max(p.architecture.mu for p in report),
                    "seconds": round(time.perf_counter() - started, 4),
                }
            )
            self._evaluate(iteration, arrays, history, entry)
            shown = {k: v for k, v in entry.items() if k not in ("iteration", "seconds")}
            log(
                INFO,
                "%s (worst party; delta %g)",
                clock.line(iteration, shown),
                self.settings.delta,
            )
            if iteration < self.settings.iterations:
                self.reached(SEARCH, done, arrays, history=history, **self.progress(stopped, done))
        self.reached(
            SEARCH, done, arrays, history=history, stage_done=True, **self.progress(stopped, done)
        )
        self.space.load_state_dict(state_dict_of(arrays))
        genotype = self.derive()
        log(INFO, "DP-FNAS genotype: %s", genotype.to_text())
        result = DPFNASResult(
            arrays=arrays,
            genotype=genotype,
            iterations=done,
            stopped=stopped,
            privacy=self.privacy(),
            history=history,
            noise=noise,
            latency=dict(self.latency),
            latency_tables=dict(self.latency_tables),
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
                **self.progress(stopped, done),
            )
        result.ledger = self.ledger.summary()
        return result

    def progress(self, stopped: str, done: int) -> dict[str, Any]:
        """What resuming the search needs besides W and A: the accountant's steps per party
        and mechanism and their history (``accounts``: [noise, rate, steps] segments), the
        server momentum, the previous W (order 2), why it stopped."""
        return {
            "stopped": stopped,
            "iterations": done,
            "steps": {str(pid): dict(steps) for pid, steps in self.steps.items()},
            "accounts": {
                str(pid): {m: [list(seg) for seg in history] for m, history in account.items()}
                for pid, account in self.accounts.items()
            },
            "momentum": {k: torch.from_numpy(np.array(v)) for k, v in self._momentum.items()},
            "previous": None if self._previous is None else state_dict_of(self._previous),
        }

    def restore_progress(self, resume: Resume) -> int:
        """Take the accountant's steps and their history, momentum and previous W from
        ``resume``; returns the search iterations done."""
        where = f"run config 'resume-from' = {resume.path!r}"
        try:
            steps = {
                int(pid): {WEIGHTS: int(s[WEIGHTS]), ARCH: int(s[ARCH])}
                for pid, s in resume.progress["steps"].items()
            }
            accounts = {
                int(pid): {m: restore_history(where, pid, m, a[m]) for m in (WEIGHTS, ARCH)}
                for pid, a in resume.progress["accounts"].items()
            }
            momentum = {k: v.numpy() for k, v in resume.progress["momentum"].items()}
            previous = resume.progress["previous"]
            done = int(resume.progress["iterations"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"{where}: its DP-FNAS progress is incomplete ({exc!r})") from exc
        if set(steps) != set(self.steps):
            raise ValueError(
                f"{where}: written for the parties {sorted(steps)}, this run has "
                f"{sorted(self.steps)}; the accountant cannot carry over"
            )
        for pid, account in accounts.items():
            for mechanism, history in account.items():
                total = sum(k for _, _, k in history)
                if pid not in steps or total != steps[pid][mechanism]:
                    raise ValueError(
                        f"{where}: the privacy history of party {pid} ({mechanism}) has "
                        f"{total} steps, its step count {steps.get(pid, {}).get(mechanism)}"
                    )
        if set(accounts) != set(steps):
            raise ValueError(
                f"{where}: privacy histories of the parties {sorted(accounts)}, step counts "
                f"of {sorted(steps)}"
            )
        if resume.within(SEARCH) and done != resume.step:
            raise ValueError(f"{where}: progress 'iterations' = {done}, its step {resume.step}")
        if not 0 <= done <= self.settings.iterations:
            raise ValueError(
                f"{where}: progress 'iterations' = {done}, allowed: 0 .. dpfnas.iterations "
                f"{self.settings.iterations}"
            )
        self._check_histories(where, accounts, done)
        self.steps = steps
        self.accounts = accounts
        self._momentum = momentum
        self._previous = None if previous is None else ArrayRecord(previous)
        return done

    def _check_histories(
        self, where: str, accounts: dict[int, dict[str, list[Segment]]], done: int
    ) -> None:
        """A party takes at most one step of each mechanism per search iteration: a history
        holding more steps than the iterations done is refused. (Its noise and rates are
        checked for range only: a library resume may change them, and the runner refuses
        such a resume through the checkpoint's bound settings.)"""
        for pid, account in accounts.items():
            for mechanism, history in account.items():
                total = sum(k for _, _, k in history)
                if total > done:
                    raise ValueError(
                        f"{where}: party {pid}'s {mechanism} history has {total} steps "
                        f"after {done} iteration(s) (at most one per iteration)"
                    )

    def _evaluate(
        self,
        iteration: int,
        arrays: ArrayRecord,
        history: list[dict[str, Any]],
        entry: dict[str, Any],
    ) -> None:
        last = iteration == self.settings.iterations
        self.record_step(
            iteration,
            arrays,
            history,
            entry,
            every=self.settings.eval_every,
            last=last,
            label="iteration",
        )

    def train_final(self, grid: Grid, result: DPFNASResult) -> None:
        """FedAvg of the derived network over the parties; test accuracy from their test splits."""
        s = self.settings
        spec = {k: v for k, v in self.space.spec.items() if k != "name"}
        # Seeded here: the global torch stream's position depends on what ran before,
        # which a resumed run does not repeat.
        seed_torch(self.seed, "final-init")
        net = type(self.space).derived_network(result.genotype.to_text(), **spec)
        fedavg = SeededFedAvg(
            nodes=self.parties,
            seed=self.seed,
            stage=FINAL,
            ledger=self.ledger,
            clients_per_round=s.final.clients_per_round or len(self.parties),
            min_replies=s.min_replies,
            train_message_type=DPFNAS_TRAIN,
            evaluate_message_type=DPFNAS_EVALUATE,
            train_counts=("train-flops",),
            min_evaluate_nodes=1,
            aggregation=self.aggregation,
        )
        config = ConfigRecord(
            {
                "method": "dpfnas",
                "phase": FINAL,
                "seed": self.seed,
                "genotype": result.genotype.to_text(),
                **s.final.client_config(),
                "noise-multiplier": s.final_noise,
                "clip": s.final_clip,
                INSECURE_KEY: s.insecure_reproducible_noise,
                # the derived net's forward FLOPs per sample (clients report train-flops)
                "net-flops": network_flops(net, self.space),
                **space_to_config(self.space.spec),
            }
        )
        with self.ledger.timed(FINAL):
            outcome = fedavg.start(
                grid,
                record_of(net.state_dict()),
                num_rounds=s.final.rounds,
                timeout=self.reply_timeout,
                train_config=self.with_user_config(DPFNAS_TRAIN, config),
                evaluate_config=self.with_user_config(DPFNAS_EVALUATE, config),
            )
        trained = trained_rounds(outcome, s.final.rounds)
        result.final_arrays, result.final_history = trained.arrays, trained.history
        result.test_accuracy = trained.test_accuracy
        log(INFO, "DP-FNAS derived network: test accuracy %s", fmt(result.test_accuracy))
        result.final_privacy = self.final_privacy()

    def noise_statement(self) -> dict[str, Any]:
        """Where the parties' DP noise comes from and whether it is private against the server."""
        s = self.settings
        if not (self.sigma > 0 or self.tau > 0 or s.final_noise > 0):
            private, statement = False, f"mode {s.mode!r} adds no noise: no privacy"
        elif s.insecure_reproducible_noise:
            private, statement = (
                False,
                (
                    "dpfnas.insecure-reproducible-noise = true: every party seeds its DP noise "
                    "and Poisson samples from the run seed, the round and its partition id, "
                    "which the server knows; the server can regenerate and subtract the noise, "
                    "so this run gives NO privacy against the server (the epsilons are void)"
                ),
            )
        else:
            private, statement = (
                True,
                (
                    "every party draws its DP noise and Poisson samples from its OS CSPRNG: "
                    "the server cannot regenerate them"
                ),
            )
        return {
            "insecure-reproducible-noise": s.insecure_reproducible_noise,
            "private-against-server": private,
            "statement": statement,
        }

    def final_privacy(self) -> list[dict[str, Any]]:
        """Per party: epsilon of its training split over the search's W steps *and* the
        final training (every round counted, a conservative bound); inf if not private."""
        s = self.settings
        report = []
        for party in self.parties:
            rate_final = min(1.0, s.final.batch_size / party.num_train)
            steps = s.final.rounds * final_steps(
                party.num_train, s.final.batch_size, s.final.local_epochs
            )
            # the search's W steps as they were taken (``accounts``), then the final training
            mechanisms = [(s.final_noise, rate_final, steps)]
            mechanisms += self.accounts[party.partition_id][WEIGHTS]
            report.append(
                {
                    "partition_id": party.partition_id,
                    "final-noise-multiplier": s.final_noise,
                    "final-sample-rate": rate_final,
                    "final-steps": steps,
                    "training-split-epsilon": self.accountant.epsilon(mechanisms),
                }
            )
        return report


def restore_history(where: str, pid: Any, mechanism: str, history: Any) -> list[Segment]:
    """A checkpoint's privacy history of one party's mechanism, checked: a list of
    [noise >= 0, 0 < rate <= 1, steps >= 1] segments; else ``ValueError`` naming it."""
    field = f"progress['accounts'][{pid!r}][{mechanism!r}]"
    if not isinstance(history, list):
        raise ValueError(f"{where}: {field} = {history!r}, expected a list of segments")
    segments: list[Segment] = []
    for segment in history:
        ok = isinstance(segment, list | tuple) and len(segment) == 3
        if ok:
            noise, rate, steps = segment
            ok = (
                all(isinstance(v, int | float) and not isinstance(v, bool) for v in segment)
                and math.isfinite(noise)
                and noise >= 0
                and math.isfinite(rate)
                and 0 < rate <= 1
                and isinstance(steps, int)
                and steps >= 1
            )
        if not ok:
            raise ValueError(
                f"{where}: {field} holds {segment!r}; allowed: [noise multiplier >= 0, "
                "0 < sample rate <= 1, steps >= 1]"
            )
        segments.append((float(segment[0]), float(segment[1]), int(segment[2])))
    return segments


def privacy_report(report: Sequence[PartyPrivacy]) -> list[dict[str, Any]]:
    """The per-party privacy report as JSON-ready dicts (``null``: no guarantee, no noise)."""
    return json_safe([{**asdict(p), "epsilon": p.epsilon} for p in report])


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float (an infinite epsilon or mu) replaced by ``None``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value
