"""FedorAS's settings: the ``fedoras.*`` run-config keys, read and checked.

The stages a run goes through (``STAGES``), Stage 1's recipe, the search's and the
fine-tuning's; ``fedoras.grad-clip``'s ``"auto"``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from ...config import (
    MethodSettings,
    SpaceSettings,
    Table,
    TrainingRecipe,
    positive,
    read_key,
    unit_interval,
)

__all__ = ["FedorASSettings"]

#: the stages of a FedorAS run, in order (``fedoras.stop-after`` names one)
STAGES = ("supernet", "search", "finetune")


#: ``fedoras.grad-clip = "auto"`` of the rnn space (the paper's text recipe)
RNN_GRAD_CLIP = 5.0


def _grad_clip(t: Table) -> float:
    """``fedoras.grad-clip`` as text, like the other keys holding numbers: a max gradient
    norm (``"0"``: off), or ``"auto"`` (the default): the space's recipe, 5 for the rnn
    space (the paper's Shakespeare setting), else off."""
    key = t.prefix + "grad-clip"
    text = t.get("grad-clip", "auto", str).strip()
    if text == "auto":
        space = read_key(t.cfg, "space.name", SpaceSettings.name, str)
        return RNN_GRAD_CLIP if space == "rnn" else 0.0
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(
            f"run config '{key}' = {text!r}: allowed: \"auto\" (5 for the rnn space, else off) "
            'or a max gradient norm >= 0 as text, e.g. "5" ("0": off)'
        )
    return value


def _stages_2_3(t: Table, cls: type[FedorASSettings], train: TrainingRecipe) -> dict[str, Any]:
    """The ``fedoras.*`` keys of aggregation, resuming, search and fine-tuning."""
    p, count = t.prefix, t.count

    population = count("search-population", cls.search_population, 2)
    evaluations = count("search-evaluations", cls.search_evaluations)
    if evaluations < population:
        raise ValueError(
            f"run config '{p}search-evaluations' = {evaluations} is below "
            f"'{p}search-population' = {population}: the first generation alone needs that many"
        )
    return {
        "aggregation": t.one_of("aggregation", cls.aggregation, ("opa", "fedavg")),
        "resume_from": t.get("resume-from", cls.resume_from, str),
        "stop_after": t.one_of("stop-after", cls.stop_after, STAGES),
        "search_scoring": t.one_of(
            "search-scoring", cls.search_scoring, ("server", "federated", "both")
        ),
        "search_objective": t.one_of("search-objective", cls.search_objective, ("flops", "params")),
        "search_population": population,
        "search_offspring": count("search-offspring", cls.search_offspring),
        "search_evaluations": evaluations,
        "search_recalibrate_bn": t.get("search-recalibrate-bn", cls.search_recalibrate_bn, bool),
        "search_calibration_batches": count(
            "search-calibration-batches", cls.search_calibration_batches
        ),
        "search_clients": count("search-clients", cls.search_clients),
        "finetune": TrainingRecipe.from_config(
            t.cfg,
            p + "finetune-",
            replace(cls.finetune, weight_decay=train.weight_decay),
            keys=("rounds", "clients_per_round", "local_epochs", "batch_size", "lr", "momentum"),
            min_rounds=1,  # Stage 3 must run: a tier model is a fine-tuned one
        ),
        "finetune_lr_decay": t.get(
            "finetune-lr-decay",
            cls.finetune_lr_decay,
            float,
            lambda v: 0 < v <= 1,
            "final lr as a fraction of finetune-lr, 0 < d <= 1",
        ),
        "finetune_lr_schedule": t.one_of(
            "finetune-lr-schedule", cls.finetune_lr_schedule, ("cosine", "step")
        ),
        "grad_clip": _grad_clip(t),
        "compare_rand_init": t.get("compare-rand-init", cls.compare_rand_init, bool),
        "rand_init_rounds": count("rand-init-rounds", 0, 0) or None,
        "rand_init_lr": t.get("rand-init-lr", 0.0, float, lambda v: v >= 0, ">= 0 (0: finetune-lr)")
        or None,
        "rand_init_clients_per_round": count("rand-init-clients-per-round", 0, 0) or None,
        "compare_random_search": t.get("compare-random-search", cls.compare_random_search, bool),
        "random_search_paths": count("random-search-paths", cls.random_search_paths),
    }


def _parse_proportions(text: str, num_tiers: int, key: str) -> tuple[float, ...]:
    """``"0.8,0.0125,0.0125,0.175"`` -> a tuple summing to 1; ``""`` -> uniform (``()``)."""
    if not text.strip():
        return ()
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise ValueError(
            f"run config '{key}' = {text!r}: expected comma-separated numbers, one per tier"
        ) from None
    if len(values) != num_tiers:
        raise ValueError(
            f"run config '{key}' = {text!r}: {len(values)} values for {num_tiers} tiers"
        )
    if any(v < 0 or not math.isfinite(v) for v in values) or not math.isclose(
        sum(values), 1.0, abs_tol=1e-6
    ):
        raise ValueError(f"run config '{key}' = {text!r}: non-negative values summing to 1")
    return values


@dataclass(frozen=True)
class FedorASSettings(MethodSettings):
    """FedorAS Stage 1 hyper-parameters (``fedoras.*`` keys).

    Paper values (CIFAR-10, Tables 9-10): 500 rounds, 10 clients per round,
    50 local epochs, SGD lr 0.1 momentum 0.9, batch 128, communication budget
    half the supernet, 4 tiers with rho = [0.0, 0.95], 100K sampled paths.
    Shakespeare (the RNN recipe): gradients clipped at norm 5 and a step lr for
    fine-tuning (10x down at 50% and 75% of the rounds, Table 10).
    The defaults here are sized for a 2-core CPU.

    ``lr_probe`` (run config ``fedoras.lr-probe``, default true): before Stage 1 the server
    halves Stage 1's ``lr`` until the supernet's first SGD steps on its slice, each on a
    fresh random path, stay bounded (``runs.probed_recipe``, the width baselines' rule;
    issue 40). The fine-tuning's ``finetune-lr`` is used as given.
    """

    TABLE: ClassVar[str] = "fedoras."
    RESUME_SAFE: ClassVar[frozenset[str]] = frozenset({"fedoras.resume-from", "fedoras.stop-after"})

    num_tiers: int = 4
    rho_low: float = 0.0
    rho_high: float = 0.95
    tier_samples: int = 20_000
    tier_proportions: tuple[float, ...] = ()
    # False: the paper's tier-unaware baseline (Figs. 1, 3): every client counts as able to
    # run every path (no tier bounds in Stage 1, every client eligible in Stages 2-3).
    tier_aware: bool = True
    # What the tiers bound: "flops" (the paper) or "latency" (each node's latency table,
    # measured on the node as run config ``latency.*`` asks; docs/fedoras.md).
    resource: str = "flops"
    train: TrainingRecipe = TrainingRecipe(
        rounds=8, clients_per_round=10, local_epochs=2, batch_size=32, lr=0.05
    )
    lr_probe: bool = True
    comm_budget: float = 0.5
    eval_every: int = 1
    eval_paths: int = 8
    min_replies: int = 2
    aggregation: str = "opa"
    resume_from: str = ""
    stop_after: str = "finetune"
    # Stage 2: NSGA-II per tier (paper: population 128, 64 offspring, ~1000 evaluations).
    search_scoring: str = "server"
    search_objective: str = "flops"
    search_population: int = 16
    search_offspring: int = 8
    search_evaluations: int = 48
    search_recalibrate_bn: bool = True
    search_calibration_batches: int = 4
    search_clients: int = 4
    # Stage 3: per-tier FedAvg fine-tuning (paper: 100 rounds, 6 clients, 1 epoch,
    # batch 32, lr 0.01 cosine down by 10x, momentum 0.9).
    # The weight decay is Stage 1's (no key of its own).
    finetune: TrainingRecipe = TrainingRecipe(
        rounds=5, clients_per_round=6, local_epochs=1, batch_size=32, lr=0.05
    )
    finetune_lr_decay: float = 0.1
    finetune_lr_schedule: str = "cosine"
    # Max L2 norm of the whole gradient in Stage 1, fine-tuning and rand-init (0: off;
    # paper, Tables 9-11: 5 on Shakespeare).
    grad_clip: float = 0.0
    compare_rand_init: bool = True
    rand_init_rounds: int | None = None  # None: as many as finetune.rounds
    rand_init_lr: float | None = None  # None: finetune.lr (paper: 0.1 against 0.01)
    # None: finetune.clients_per_round (paper, Table 11: 10 on CIFAR against 6 in fine-tuning)
    rand_init_clients_per_round: int | None = None
    compare_random_search: bool = False
    random_search_paths: int = 4

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> FedorASSettings:
        p = "fedoras."
        t = Table(cfg, p)
        num_tiers = t.get("num-tiers", cls.num_tiers, int, lambda v: 1 <= v <= 16, "1..16")
        rho_low = t.get("rho-low", cls.rho_low, float, unit_interval, "0 <= rho-low <= 1")
        rho_high = t.get("rho-high", cls.rho_high, float, lambda v: 0 < v <= 1, "0 < rho-high <= 1")
        if rho_low >= rho_high:
            raise ValueError(
                f"run config '{p}rho-low' = {rho_low} must be below '{p}rho-high' = {rho_high}"
            )
        if rho_low > 0 and num_tiers < 3:
            raise ValueError(
                f"run config '{p}rho-low' = {rho_low} needs at least 3 tiers "
                f"('{p}num-tiers' = {num_tiers}); use rho-low = 0"
            )
        proportions = _parse_proportions(
            t.get("tier-proportions", "", str), num_tiers, p + "tier-proportions"
        )
        train = TrainingRecipe.from_config(cfg, p, cls.train, min_rounds=1)  # Stage 1 must run
        min_replies = t.min_replies(cls.min_replies, train)
        return cls(
            num_tiers=num_tiers,
            rho_low=rho_low,
            rho_high=rho_high,
            tier_samples=t.get("tier-samples", cls.tier_samples, int, lambda v: v >= 100, ">= 100"),
            tier_proportions=proportions,
            tier_aware=t.get("tier-aware", cls.tier_aware, bool),
            resource=t.one_of("resource", cls.resource, ("flops", "latency")),
            train=train,
            lr_probe=t.flag("lr-probe", cls.lr_probe),
            comm_budget=t.get(
                "comm-budget",
                cls.comm_budget,
                float,
                lambda v: 0 < v <= 1,
                "fraction of the supernet's size, 0 < b <= 1",
            ),
            eval_every=t.get("eval-every", cls.eval_every, int, lambda v: v >= 0, ">= 0"),
            eval_paths=t.get("eval-paths", cls.eval_paths, int, positive, ">= 1"),
            min_replies=min_replies,
            **_stages_2_3(t, cls, train),
            **cls.shared_from_config(cfg),
        )
