"""Run config -> typed, validated settings.

The run config (``[tool.flwr.app.config]`` in ``pyproject.toml``, overridable
with ``flwr run . --run-config "k=v"``) arrives flattened: the sub-table
``[tool.flwr.app.config.fedoras]`` becomes ``fedoras.<key>``.  Everything is
checked here, before any training, and a bad value raises ``ValueError``
naming the key, the value and what is allowed.  An unknown key (a typo such as
``fedoras.round``) raises too, suggesting the closest known one; the known keys
are the ones the parser reads (:func:`known_keys`), so there is no second list.
"""

from __future__ import annotations

import contextvars
import difflib
import functools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .data import DatasetInfo, DataSpec
from .latency import DEFAULT_REPEATS, DEFAULT_STATISTIC, DEFAULT_WARMUP, STATISTICS, LatencyRequest
from .training import check_device_setting

__all__ = [
    "METHODS",
    "DECNAS_VARIANTS",
    "DecNASSettings",
    "DPFNASSettings",
    "FEDORAS_STAGES",
    "FDNASSettings",
    "FedorASSettings",
    "RunSettings",
    "SpaceSettings",
    "TrainingRecipe",
    "check_known_keys",
    "known_keys",
    "parse_run_config",
    "space_kwargs",
    "RESUME_SAFE_KEYS",
    "bound_settings",
]

METHODS = ("fedoras", "fdnas", "cfdnas", "dpfnas", "decnas")
SPACE_NAMES = ("cnn_l", "cnn_s", "rnn", "mbconv", "darts")
FEDORAS_STAGES = ("supernet", "search", "finetune")


def _get(
    cfg: Mapping[str, Any],
    key: str,
    default: Any,
    kind: type,
    check: Callable[[Any], bool] | None = None,
    allowed: str = "",
) -> Any:
    """Read ``key`` as ``kind`` (an int is accepted for a float), or raise."""
    value = cfg.get(key, default)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if kind is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise ValueError(
            f"run config '{key}' = {value!r}: expected a {kind.__name__}"
            + (f" ({allowed})" if allowed else "")
        )
    if kind is float and not math.isfinite(value):
        raise ValueError(f"run config '{key}' = {value!r}: expected a finite number")
    if check is not None and not check(value):
        raise ValueError(f"run config '{key}' = {value!r}: allowed: {allowed}")
    read = _READ.get()
    if read is not None:
        read[key] = value
    return value


#: While ``parse_run_config`` runs: every key ``_get`` read, with the value it took (the
#: run config's or the default) -> ``RunSettings.values``.
_READ: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "run_config_read", default=None
)


def _positive(value: float) -> bool:
    return value > 0


def _unit_interval(value: float) -> bool:
    return 0.0 <= value <= 1.0


_RECIPE_KEYS = {
    "rounds": "rounds",
    "clients_per_round": "clients-per-round",
    "local_epochs": "local-epochs",
    "batch_size": "batch-size",
    "lr": "lr",
    "momentum": "momentum",
    "weight_decay": "weight-decay",
}


@dataclass(frozen=True)
class TrainingRecipe:
    """One federated training recipe, the same type in every method and stage: ``rounds``
    of ``clients_per_round`` clients (0: every node), each running ``local_epochs`` of SGD
    (``batch_size``, ``lr``, ``momentum``, ``weight_decay``).

    Its run-config keys are the field names in kebab case under a stage's prefix
    (``fedoras.rounds``, ``fedoras.finetune-lr``, ``fdnas.final-local-epochs``, ...)."""

    rounds: int
    clients_per_round: int
    local_epochs: int = 1
    batch_size: int = 32
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.0

    def client_config(self, **overrides: Any) -> dict[str, Any]:
        """The local-SGD entries of a training message (``lr`` etc. may be overridden,
        e.g. by a schedule)."""
        config = {
            "local-epochs": self.local_epochs,
            "batch-size": self.batch_size,
            "lr": self.lr,
            "momentum": self.momentum,
            "weight-decay": self.weight_decay,
        }
        return {**config, **overrides}

    def clients(self, available: int) -> int:
        """Clients of one round among ``available`` nodes (``clients_per_round`` 0: all)."""
        return min(self.clients_per_round or available, available)

    @classmethod
    def from_config(
        cls,
        cfg: Mapping[str, Any],
        prefix: str,
        default: TrainingRecipe,
        *,
        keys: Iterable[str] = tuple(_RECIPE_KEYS),
        names: Mapping[str, str] | None = None,
        all_clients: bool = False,
        min_rounds: int = 0,
    ) -> TrainingRecipe:
        """Read the fields in ``keys`` from ``<prefix><key>`` (``names`` renames a key);
        the others keep ``default``'s values.  ``all_clients``: 0 clients per round means
        every node; ``min_rounds`` 1: a stage that must run (0 rounds refused)."""
        names = {**_RECIPE_KEYS, **(names or {})}
        low_clients = 0 if all_clients else 1
        checks: dict[str, tuple[type, Callable[[Any], bool], str]] = {
            "rounds": (int, lambda v: v >= min_rounds, f">= {min_rounds}"),
            "clients_per_round": (
                int,
                lambda v: v >= low_clients,
                ">= 0 (0: every node)" if all_clients else ">= 1",
            ),
            "local_epochs": (int, _positive, ">= 1"),
            "batch_size": (int, _positive, ">= 1"),
            "lr": (float, _positive, "> 0"),
            "momentum": (float, lambda v: 0 <= v < 1, "0 <= m < 1"),
            "weight_decay": (float, lambda v: v >= 0, ">= 0"),
        }
        values = {}
        for name in keys:
            kind, check, allowed = checks[name]
            values[name] = _get(
                cfg, prefix + names[name], getattr(default, name), kind, check, allowed
            )
        return replace(default, **values)


@dataclass(frozen=True)
class SpaceSettings:
    """Which search space to build and how large (``space.*`` keys)."""

    name: str = "cnn_s"
    width: float = 0.5
    layers_per_block: int = 4

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> SpaceSettings:
        return cls(
            name=_get(
                cfg,
                "space.name",
                cls.name,
                str,
                lambda v: v in SPACE_NAMES,
                "one of " + ", ".join(SPACE_NAMES),
            ),
            width=_get(
                cfg, "space.width", cls.width, float, lambda v: 0 < v <= 4, "0 < width <= 4"
            ),
            layers_per_block=_get(
                cfg,
                "space.layers-per-block",
                cls.layers_per_block,
                int,
                lambda v: 1 <= v <= 8,
                "1..8 (cnn_l blocks, mbconv stages, darts cells)",
            ),
        )


def space_kwargs(space: SpaceSettings, info: DatasetInfo) -> dict[str, Any]:
    """Keyword arguments of ``build_space`` for ``space`` on the dataset ``info``."""
    if space.name == "rnn":
        if info.kind != "text":
            raise ValueError(
                f"run config 'space.name' = 'rnn' needs a text dataset; "
                f"'data.dataset' = {info.name!r} is {info.kind}: use cnn_s or cnn_l"
            )
        return {
            "name": "rnn",
            "vocab_size": info.num_classes,
            "seq_len": info.input_shape[0],
            "width": space.width,
        }
    if info.kind != "image":
        raise ValueError(
            f"run config 'space.name' = {space.name!r} needs an image dataset; "
            f"'data.dataset' = {info.name!r} is {info.kind}: use rnn"
        )
    channels, height, width = info.input_shape
    kwargs: dict[str, Any] = {
        "name": space.name,
        "num_classes": info.num_classes,
        "in_channels": channels,
        "input_height": height,
        "input_width": width,
        "width": space.width,
    }
    if space.name == "cnn_l":
        kwargs["layers_per_block"] = space.layers_per_block
    if space.name == "mbconv":
        kwargs["layers_per_stage"] = space.layers_per_block
    if space.name == "darts":
        # C = 8 x width (DARTS: 16); inputs above 16 px are halved by the stem (CPU-sized).
        del kwargs["width"]
        kwargs.update(
            channels=max(2, round(8 * space.width)),
            cells=space.layers_per_block,
            stem_stride=2 if height > 16 else 1,
        )
    return kwargs


@dataclass(frozen=True)
class FedorASSettings:
    """FedorAS Stage 1 hyper-parameters (``fedoras.*`` keys).

    Paper values (CIFAR-10, Tables 9-10): 500 rounds, 10 clients per round,
    50 local epochs, SGD lr 0.1 momentum 0.9, batch 128, communication budget
    half the supernet, 4 tiers with rho = [0.0, 0.95], 100K sampled paths.
    Shakespeare (the RNN recipe): gradients clipped at norm 5 and a step lr for
    fine-tuning (10x down at 50% and 75% of the rounds, Table 10).
    The defaults here are sized for a 2-core CPU.
    """

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
        rounds=20, clients_per_round=10, local_epochs=5, batch_size=32, lr=0.1
    )
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
        rounds=10, clients_per_round=6, local_epochs=1, batch_size=32, lr=0.05
    )
    finetune_lr_decay: float = 0.1
    finetune_lr_schedule: str = "cosine"
    # Max L2 norm of the whole gradient in Stage 1, fine-tuning and rand-init (0: off;
    # paper, Tables 9-11: 5 on Shakespeare).
    grad_clip: float = 0.0
    compare_rand_init: bool = True
    rand_init_rounds: int | None = None  # None: as many as finetune.rounds
    rand_init_lr: float | None = None  # None: finetune.lr (paper: 0.1 against 0.01)
    compare_random_search: bool = False
    random_search_paths: int = 4

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> FedorASSettings:
        p = "fedoras."
        _check_table(cfg, p)
        num_tiers = _get(cfg, p + "num-tiers", cls.num_tiers, int, lambda v: 1 <= v <= 16, "1..16")
        rho_low = _get(cfg, p + "rho-low", cls.rho_low, float, _unit_interval, "0 <= rho-low <= 1")
        rho_high = _get(
            cfg, p + "rho-high", cls.rho_high, float, lambda v: 0 < v <= 1, "0 < rho-high <= 1"
        )
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
            _get(cfg, p + "tier-proportions", "", str), num_tiers, p + "tier-proportions"
        )
        train = TrainingRecipe.from_config(cfg, p, cls.train, min_rounds=1)  # Stage 1 must run
        min_replies = _min_replies(cfg, p, cls.min_replies, train)
        return cls(
            num_tiers=num_tiers,
            rho_low=rho_low,
            rho_high=rho_high,
            tier_samples=_get(
                cfg, p + "tier-samples", cls.tier_samples, int, lambda v: v >= 100, ">= 100"
            ),
            tier_proportions=proportions,
            tier_aware=_get(cfg, p + "tier-aware", cls.tier_aware, bool),
            resource=_one_of(cfg, p + "resource", cls.resource, ("flops", "latency")),
            train=train,
            comm_budget=_get(
                cfg,
                p + "comm-budget",
                cls.comm_budget,
                float,
                lambda v: 0 < v <= 1,
                "fraction of the supernet's size, 0 < b <= 1",
            ),
            eval_every=_get(cfg, p + "eval-every", cls.eval_every, int, lambda v: v >= 0, ">= 0"),
            eval_paths=_get(cfg, p + "eval-paths", cls.eval_paths, int, _positive, ">= 1"),
            min_replies=min_replies,
            **_fedoras_stages_2_3(cfg, cls, p, train),
        )


def _min_replies(cfg: Mapping[str, Any], p: str, default: int, train: TrainingRecipe) -> int:
    """``<p>min-replies``, at most the recipe's clients per round."""
    min_replies = _get(cfg, p + "min-replies", default, int, _positive, ">= 1")
    if train.clients_per_round and min_replies > train.clients_per_round:
        raise ValueError(
            f"run config '{p}min-replies' = {min_replies} exceeds "
            f"'{p}clients-per-round' = {train.clients_per_round}"
        )
    return min_replies


def _check_table(cfg: Mapping[str, Any], prefix: str) -> None:
    """Refuse a key of ``cfg`` in this table (``<prefix>...``) that no parser reads, with the
    closest known key: a library user's own run config may hold keys of its own, but a
    misspelled ``fedoras.round`` must not pass silently."""
    ours = [k for k in cfg if k.startswith(prefix)]
    if ours:  # (never while known_keys() itself parses: its configs hold no table keys)
        check_known_keys(ours)


def _readers(cfg: Mapping[str, Any], p: str) -> tuple[Callable[..., float], Callable[..., int]]:
    """``number(key, default, check, allowed)`` and ``count(key, default, low)`` reading
    ``<p><key>`` from ``cfg``."""

    def number(key: str, default: float, check=_positive, allowed: str = "> 0") -> float:
        return _get(cfg, p + key, default, float, check, allowed)

    def count(key: str, default: int, low: int = 1) -> int:
        return _get(cfg, p + key, default, int, lambda v: v >= low, f">= {low}")

    return number, count


def _one_of(cfg: Mapping[str, Any], key: str, default: str, allowed: tuple[str, ...]) -> str:
    return _get(cfg, key, default, str, lambda v: v in allowed, "one of " + ", ".join(allowed))


#: ``fedoras.grad-clip = "auto"`` of the rnn space (the paper's text recipe)
RNN_GRAD_CLIP = 5.0


def _grad_clip(cfg: Mapping[str, Any], key: str) -> float:
    """``fedoras.grad-clip`` as text, like the other keys holding numbers: a max gradient
    norm (``"0"``: off), or ``"auto"`` (the default): the space's recipe, 5 for the rnn
    space (the paper's Shakespeare setting), else off."""
    text = _get(cfg, key, "auto", str).strip()
    if text == "auto":
        space = _get(cfg, "space.name", SpaceSettings.name, str)
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


def _fedoras_stages_2_3(
    cfg: Mapping[str, Any], cls: type[FedorASSettings], p: str, train: TrainingRecipe
) -> dict[str, Any]:
    """The ``fedoras.*`` keys of aggregation, resuming, search and fine-tuning."""

    _, count = _readers(cfg, p)

    population = count("search-population", cls.search_population, 2)
    evaluations = count("search-evaluations", cls.search_evaluations)
    if evaluations < population:
        raise ValueError(
            f"run config '{p}search-evaluations' = {evaluations} is below "
            f"'{p}search-population' = {population}: the first generation alone needs that many"
        )
    return {
        "aggregation": _one_of(cfg, p + "aggregation", cls.aggregation, ("opa", "fedavg")),
        "resume_from": _get(cfg, p + "resume-from", cls.resume_from, str),
        "stop_after": _one_of(cfg, p + "stop-after", cls.stop_after, FEDORAS_STAGES),
        "search_scoring": _one_of(
            cfg, p + "search-scoring", cls.search_scoring, ("server", "federated", "both")
        ),
        "search_objective": _one_of(
            cfg, p + "search-objective", cls.search_objective, ("flops", "params")
        ),
        "search_population": population,
        "search_offspring": count("search-offspring", cls.search_offspring),
        "search_evaluations": evaluations,
        "search_recalibrate_bn": _get(
            cfg, p + "search-recalibrate-bn", cls.search_recalibrate_bn, bool
        ),
        "search_calibration_batches": count(
            "search-calibration-batches", cls.search_calibration_batches
        ),
        "search_clients": count("search-clients", cls.search_clients),
        "finetune": TrainingRecipe.from_config(
            cfg,
            p + "finetune-",
            replace(cls.finetune, weight_decay=train.weight_decay),
            keys=("rounds", "clients_per_round", "local_epochs", "batch_size", "lr", "momentum"),
            min_rounds=1,  # Stage 3 must run: a tier model is a fine-tuned one
        ),
        "finetune_lr_decay": _get(
            cfg,
            p + "finetune-lr-decay",
            cls.finetune_lr_decay,
            float,
            lambda v: 0 < v <= 1,
            "final lr as a fraction of finetune-lr, 0 < d <= 1",
        ),
        "finetune_lr_schedule": _one_of(
            cfg, p + "finetune-lr-schedule", cls.finetune_lr_schedule, ("cosine", "step")
        ),
        "grad_clip": _grad_clip(cfg, p + "grad-clip"),
        "compare_rand_init": _get(cfg, p + "compare-rand-init", cls.compare_rand_init, bool),
        "rand_init_rounds": count("rand-init-rounds", 0, 0) or None,
        "rand_init_lr": _get(
            cfg, p + "rand-init-lr", 0.0, float, lambda v: v >= 0, ">= 0 (0: finetune-lr)"
        )
        or None,
        "compare_random_search": _get(
            cfg, p + "compare-random-search", cls.compare_random_search, bool
        ),
        "random_search_paths": count("random-search-paths", cls.random_search_paths),
    }


@dataclass(frozen=True)
class FDNASSettings:
    """FDNAS / CFDNAS hyper-parameters (``fdnas.*`` keys).

    Paper values (CIFAR-10, Zhang et al. 2020): 125 search rounds of 10
    clients, 5 local epochs, batch 256, SGD lr 0.05 cosine, momentum 0.9,
    weight decay 3e-4 for w; Adam without weight decay for alpha (ProxylessNAS:
    lr 6e-3, betas (0, 0.999)); 90/10 train/validation split; CFDNAS 25 rounds
    per cluster; the derived net trained with FedAvg for 250 rounds.  The
    hardware term is ``CE + beta log(E[FLOPs] / target)^2`` (two-sided); targets are
    fractions of the supernet's largest path, as is ``max_flops``, the bound on every
    derived net (the most probable path within it; 1: plain argmax).  Defaults are sized
    for a 2-core CPU.  ``resource = "latency"``: the hardware term uses the expected
    latency on the nodes' measured tables instead, with targets in milliseconds
    (``target_ms``, ``cluster_target_ms``), which also bound the derived nets.
    """

    train: TrainingRecipe = TrainingRecipe(
        rounds=10, clients_per_round=10, local_epochs=1, batch_size=32, lr=0.05, weight_decay=3e-4
    )
    alpha_lr: float = 6e-3
    alpha_every: int = 1
    warmup_rounds: int = 0
    target_flops: float = 0.5
    max_flops: float = 1.0
    hardware_beta: float = 1.0
    num_clusters: int = 3
    cluster_rounds: int = 3
    cluster_target_flops: tuple[float, ...] = (0.35,)
    # The derived net's FedAvg: clients, batch, momentum and weight decay are the search's.
    final: TrainingRecipe = TrainingRecipe(
        rounds=5, clients_per_round=10, local_epochs=1, batch_size=32, lr=0.05, weight_decay=3e-4
    )
    final_init: str = "scratch"
    min_replies: int = 2
    resource: str = "flops"
    target_ms: float = 0.0
    cluster_target_ms: tuple[float, ...] = ()

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> FDNASSettings:
        p = "fdnas."
        _check_table(cfg, p)
        fraction = (lambda v: 0 < v <= 1, "fraction of the largest path's FLOPs, 0 < f <= 1")
        train = TrainingRecipe.from_config(cfg, p, cls.train, min_rounds=1)  # the search runs
        min_replies = _min_replies(cfg, p, cls.min_replies, train)
        text = _get(cfg, p + "cluster-target-flops", "0.35", str)
        try:
            targets = tuple(float(v) for v in text.split(","))
        except ValueError:
            targets = ()
        if not targets or not all(0 < v <= 1 for v in targets):
            raise ValueError(
                f"run config '{p}cluster-target-flops' = {text!r}: comma-separated fractions "
                "in (0, 1], one for every cluster or one per cluster (in cluster order)"
            )
        return cls(
            train=train,
            alpha_lr=_get(cfg, p + "alpha-lr", cls.alpha_lr, float, _positive, "> 0"),
            alpha_every=_get(
                cfg, p + "alpha-every", cls.alpha_every, int, lambda v: v >= 0, ">= 0 (0: never)"
            ),
            warmup_rounds=_get(
                cfg,
                p + "warmup-rounds",
                cls.warmup_rounds,
                int,
                lambda v: v == 0 or 0 < v < train.rounds,
                f"0 <= N < fdnas.rounds = {train.rounds} (at least one round updates alpha)",
            ),
            target_flops=_get(cfg, p + "target-flops", cls.target_flops, float, *fraction),
            max_flops=_get(cfg, p + "max-flops", cls.max_flops, float, *fraction),
            hardware_beta=_get(
                cfg, p + "hardware-beta", cls.hardware_beta, float, lambda v: v >= 0, ">= 0"
            ),
            num_clusters=_get(
                cfg,
                p + "num-clusters",
                cls.num_clusters,
                int,
                _positive,
                ">= 1 (used unless the partitioner is class-groups or nodes declare 'cluster')",
            ),
            cluster_rounds=_get(
                cfg, p + "cluster-rounds", cls.cluster_rounds, int, _positive, ">= 1"
            ),
            cluster_target_flops=targets,
            final=TrainingRecipe.from_config(
                cfg,
                p + "final-",
                replace(train, rounds=cls.final.rounds, lr=cls.final.lr),
                keys=("rounds", "local_epochs", "lr"),
            ),
            final_init=_get(
                cfg,
                p + "final-init",
                cls.final_init,
                str,
                lambda v: v in ("scratch", "supernet"),
                "scratch or supernet",
            ),
            min_replies=min_replies,
            **_fdnas_latency(cfg, p),
        )

    def fresh_cluster_warmup(self) -> int:
        """Warm-up rounds of a fresh cluster supernet (naive-CFDNAS): the global search's
        share of its rounds, rounded down, so that a short cluster search still updates
        alpha."""
        if not self.train.rounds:
            return 0
        return self.warmup_rounds * self.cluster_rounds // self.train.rounds

    def cluster_target(self, index: int) -> float:
        """The target of the ``index``-th cluster in sorted tag order: a fraction of the
        largest path's FLOPs, or milliseconds with ``resource = "latency"``."""
        targets = (
            self.cluster_target_ms if self.resource == "latency" else self.cluster_target_flops
        )
        return targets[index] if len(targets) > 1 else targets[0]

    def cluster_targets_key(self) -> str:
        """The run-config key of the per-cluster targets of this ``resource``."""
        return "fdnas.cluster-target-" + ("ms" if self.resource == "latency" else "flops")


def _fdnas_latency(cfg: Mapping[str, Any], p: str) -> dict[str, Any]:
    """``fdnas.resource``, ``fdnas.target-ms`` and ``fdnas.cluster-target-ms``: with the
    resource latency both targets are required, in milliseconds (0 / "": unset)."""
    resource = _one_of(cfg, p + "resource", FDNASSettings.resource, ("flops", "latency"))
    target = _get(cfg, p + "target-ms", 0.0, float, lambda v: v >= 0, "> 0 ms (0: unset)")
    text = _get(cfg, p + "cluster-target-ms", "", str).strip()
    try:
        targets = tuple(float(v) for v in text.split(",")) if text else ()
    except ValueError:
        targets = (math.nan,)
    if not all(math.isfinite(v) and v > 0 for v in targets):
        raise ValueError(
            f"run config '{p}cluster-target-ms' = {text!r}: comma-separated milliseconds > 0, "
            "one for every cluster or one per cluster (in cluster order)"
        )
    if resource == "latency":
        if target <= 0:
            raise ValueError(
                f"run config '{p}target-ms' = {target!r}: with '{p}resource' = 'latency' give "
                "the global search's latency target in milliseconds, > 0"
            )
        if cfg.get("method") == "cfdnas" and not targets:
            raise ValueError(
                f"run config '{p}cluster-target-ms' = '': with '{p}resource' = 'latency' give "
                'the clusters\' latency targets in milliseconds, e.g. "2.5" or "3,1.5"'
            )
        max_flops = _get(cfg, p + "max-flops", FDNASSettings.max_flops, float)
        if max_flops < 1:
            raise ValueError(
                f"run config '{p}max-flops' = {max_flops!r}: with '{p}resource' = 'latency' "
                "the latency targets bound the derived nets; allowed: 1.0"
            )
    return {"resource": resource, "target_ms": target, "cluster_target_ms": targets}


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
class DPFNASSettings:
    """DP-FNAS hyper-parameters (``dpfnas.*`` keys; Singh et al., 2020, Algorithm 1).

    Paper values (CIFAR-10, §4.1): sigma^2 = tau^2 = 1 (``noise-weights`` =
    ``noise-arch`` = 1), R_G = 0.01, R_H = 0.1, second-order architecture
    gradients, server steps ``W <- W - xi * sum_k G_k`` (``aggregation`` =
    "sum"), DARTS schedule (50 epochs, batch 64, w: lr 0.025 momentum 0.9;
    alpha: Adam 3e-4), final training 600 epochs.  The defaults here are sized
    for a 2-core CPU and MNIST-5k.  ``mode``: "dpfnas" (noise), "fnas" (no
    noise), "single" (one party, no noise: vanilla DARTS).  ``final-noise`` > 0
    makes the final FedAvg training DP-SGD (accounted with the search's W steps).
    ``insecure_reproducible_noise``: parties seed their noise and Poisson samples from
    the run seed (reproducible runs) - the server can then subtract the noise, so the
    run gives no privacy against it; off by default (the OS CSPRNG, ``secure_random``).
    """

    mode: str = "dpfnas"
    iterations: int = 20
    batch_size: int = 32
    weight_lr: float = 0.05
    weight_momentum: float = 0.9
    arch_lr: float = 0.01
    arch_momentum: float = 0.9
    clip_weights: float = 1.0
    clip_arch: float = 0.1
    noise_weights: float = 1.0
    noise_arch: float = 1.0
    order: int = 1
    aggregation: str = "mean"
    target_epsilon: float = 0.0
    delta: float = 1e-5
    accountant: str = "rdp"
    eval_every: int = 5
    min_replies: int = 1
    # The derived net's FedAvg (clients 0: every party).
    final: TrainingRecipe = TrainingRecipe(
        rounds=5, clients_per_round=0, local_epochs=1, batch_size=32, lr=0.05
    )
    final_noise: float = 0.0
    final_clip: float = 1.0
    insecure_reproducible_noise: bool = False
    # "latency": the genotype is derived within ``latency_budget_ms`` on the parties'
    # latency tables (no resource term in the paper; docs/dpfnas.md)
    resource: str = "none"
    latency_budget_ms: float = 0.0

    @property
    def noisy(self) -> bool:
        """Whether gradients are noised (mode "dpfnas")."""
        return self.mode == "dpfnas"

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> DPFNASSettings:
        p = "dpfnas."
        _check_table(cfg, p)

        number, count = _readers(cfg, p)

        def non_negative(v: float) -> bool:
            return v >= 0

        def momentum(v: float) -> bool:
            return 0 <= v < 1

        return cls(
            mode=_get(
                cfg,
                p + "mode",
                cls.mode,
                str,
                lambda v: v in ("dpfnas", "fnas", "single"),
                "dpfnas, fnas or single",
            ),
            iterations=count("iterations", cls.iterations),  # >= 1: the search must run
            batch_size=count("batch-size", cls.batch_size),
            weight_lr=number("weight-lr", cls.weight_lr),
            weight_momentum=number("weight-momentum", cls.weight_momentum, momentum, "0 <= m < 1"),
            arch_lr=number("arch-lr", cls.arch_lr),
            arch_momentum=number("arch-momentum", cls.arch_momentum, momentum, "0 <= m < 1"),
            clip_weights=number("clip-weights", cls.clip_weights),
            clip_arch=number("clip-arch", cls.clip_arch),
            noise_weights=number("noise-weights", cls.noise_weights, non_negative, ">= 0"),
            noise_arch=number("noise-arch", cls.noise_arch, non_negative, ">= 0"),
            order=_get(cfg, p + "order", cls.order, int, lambda v: v in (1, 2), "1 or 2"),
            aggregation=_get(
                cfg,
                p + "aggregation",
                cls.aggregation,
                str,
                lambda v: v in ("mean", "sum"),
                "mean or sum",
            ),
            target_epsilon=number(
                "target-epsilon", cls.target_epsilon, non_negative, ">= 0 (0: no target)"
            ),
            delta=number("delta", cls.delta, lambda v: 0 < v < 1, "0 < delta < 1"),
            accountant=_get(
                cfg,
                p + "accountant",
                cls.accountant,
                str,
                lambda v: v in ("rdp", "prv", "gdp"),
                "rdp, prv or gdp",
            ),
            eval_every=count("eval-every", cls.eval_every, 0),
            min_replies=count("min-replies", cls.min_replies),
            final=TrainingRecipe.from_config(
                cfg,
                p + "final-",
                cls.final,
                keys=(
                    "rounds",
                    "clients_per_round",
                    "local_epochs",
                    "batch_size",
                    "lr",
                    "momentum",
                ),
                all_clients=True,
            ),
            final_noise=number(
                "final-noise", cls.final_noise, non_negative, ">= 0 (0: not private)"
            ),
            final_clip=number("final-clip", cls.final_clip),
            insecure_reproducible_noise=_get(
                cfg, p + "insecure-reproducible-noise", cls.insecure_reproducible_noise, bool
            ),
            **_dpfnas_latency(cfg, p),
        )


def _dpfnas_latency(cfg: Mapping[str, Any], p: str) -> dict[str, Any]:
    """``dpfnas.resource`` and ``dpfnas.latency-budget-ms`` (required with the latency)."""
    resource = _one_of(cfg, p + "resource", DPFNASSettings.resource, ("none", "latency"))
    budget = _get(cfg, p + "latency-budget-ms", 0.0, float, lambda v: v >= 0, "> 0 ms (0: unset)")
    if resource == "latency" and budget <= 0:
        raise ValueError(
            f"run config '{p}latency-budget-ms' = {budget!r}: with '{p}resource' = 'latency' "
            "give the derived network's latency budget in milliseconds, > 0"
        )
    return {"resource": resource, "latency_budget_ms": budget}


DECNAS_VARIANTS = ("decnas", "naive", "no-groups", "no-drop", "no-dynamic-rounds", "centralised")


@dataclass(frozen=True)
class DecNASSettings:
    """DecNAS (federated NetAdapt) hyper-parameters (``decnas.*`` keys; Algorithm 4.1).

    Paper values (§5.1, §5.3): resource = MACs; budget reduced by 5% of
    Res(GM_0) per iteration, decaying by 0.93 (ConvNet) or 0.98 (MobileNet);
    targets 50%/25%/15%; 20 (CelebA) or 15 (ImageNet) groups, r = 1.1; 33% of
    the candidates dropped per round; rounds 2, 5, 8, 10 every 5 iterations
    (CelebA); train/val/test 6:2:2 (``data.val-fraction`` / ``data.test-fraction``,
    0.1 / 0.1 by default for every method); GM_t the most accurate survivor (``pick``
    "accuracy"; default "degradation", the dropping rule).  Defaults are sized for a
    2-core CPU.
    ``variant`` switches the optimisations off for the comparisons: "naive"
    (every client trains every candidate, no dropping, the largest round number
    every iteration), "no-groups", "no-drop", "no-dynamic-rounds" (one off
    each), "centralised" (NetAdapt: run it with one node holding all the data).
    ``resource`` "latency" is NetAdapt's own: milliseconds predicted by the layer-wise
    latency tables of the target nodes (``latency_devices``: their node config
    ``device-class``; docs/decnas.md).
    """

    model: str = "convnet"
    variant: str = "decnas"
    resource: str = "macs"
    target: float = 0.5
    initial_reduction: float = 0.1
    decay: float = 0.93
    max_iterations: int = 20
    num_groups: int = 5
    balance_ratio: float = 1.1
    drop_ratio: float = 0.33
    rounds: tuple[int, ...] = (1, 2, 3)
    rounds_every: int = 2
    # Every FedAvg stage's recipe: its rounds are GM_0's (``gm0-rounds``); clients 0: all.
    train: TrainingRecipe = TrainingRecipe(
        rounds=10, clients_per_round=0, local_epochs=1, batch_size=32, lr=0.05
    )
    min_filters: int = 1
    final_rounds: int = 5
    final_models: str = "last"
    pick: str = "degradation"
    width_baseline: bool = False
    min_replies: int = 1
    # resource = "latency": the target devices (node config ``device-class``; "": every
    # node) and the grid points per layer of their layer-wise tables (decnas/latency.py).
    latency_devices: str = ""
    latency_grid: int = 8

    @property
    def grouping(self) -> bool:
        """Whether candidates are trained by groups (else every client trains each)."""
        return self.variant not in ("naive", "no-groups", "centralised")

    @property
    def dropping(self) -> bool:
        """Whether weak candidates are dropped early."""
        return self.variant not in ("naive", "no-drop", "centralised")

    @property
    def dynamic_rounds(self) -> bool:
        """Whether the round number grows with the iterations (else always the largest)."""
        return self.variant not in ("naive", "no-dynamic-rounds", "centralised")

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> DecNASSettings:
        p = "decnas."
        _check_table(cfg, p)

        number, count = _readers(cfg, p)

        text = _get(cfg, p + "rounds", ",".join(map(str, cls.rounds)), str)
        try:
            rounds = tuple(int(v) for v in text.split(","))
        except ValueError:
            rounds = ()
        if not rounds or min(rounds) < 1:
            raise ValueError(
                f"run config '{p}rounds' = {text!r}: comma-separated round numbers >= 1, "
                "one per block of 'rounds-every' iterations, e.g. \"2,5,8,10\""
            )
        return cls(
            model=_one_of(cfg, p + "model", cls.model, ("convnet", "mobilenet")),
            variant=_one_of(cfg, p + "variant", cls.variant, DECNAS_VARIANTS),
            resource=_one_of(cfg, p + "resource", cls.resource, ("macs", "params", "latency")),
            target=number("target", cls.target, lambda v: 0 < v < 1, "fraction of GM_0, 0 < t < 1"),
            initial_reduction=number(
                "initial-reduction", cls.initial_reduction, lambda v: 0 < v < 1, "0 < r < 1"
            ),
            decay=number("decay", cls.decay, lambda v: 0 < v <= 1, "0 < decay <= 1"),
            max_iterations=count("max-iterations", cls.max_iterations),
            num_groups=count("num-groups", cls.num_groups),
            balance_ratio=number("balance-ratio", cls.balance_ratio, lambda v: v >= 1, ">= 1"),
            drop_ratio=number("drop-ratio", cls.drop_ratio, _unit_interval, "0 <= alpha <= 1"),
            rounds=rounds,
            rounds_every=count("rounds-every", cls.rounds_every),
            train=TrainingRecipe.from_config(
                cfg, p, cls.train, names={"rounds": "gm0-rounds"}, all_clients=True
            ),
            min_filters=count("min-filters", cls.min_filters),
            final_rounds=count("final-rounds", cls.final_rounds, 0),
            final_models=_one_of(cfg, p + "final-models", cls.final_models, ("last", "all")),
            pick=_one_of(cfg, p + "pick", cls.pick, ("degradation", "accuracy")),
            width_baseline=_get(cfg, p + "width-baseline", cls.width_baseline, bool),
            min_replies=count("min-replies", cls.min_replies),
            latency_devices=_latency_devices(cfg, p),
            latency_grid=_get(
                cfg, p + "latency-grid", cls.latency_grid, int, lambda v: 1 <= v <= 64, "1..64"
            ),
        )


def _latency_devices(cfg: Mapping[str, Any], p: str) -> str:
    """``decnas.latency-devices``: a device-class name (letters, digits, ``._-``) or "",
    meaningful with ``decnas.resource = "latency"`` only."""
    key = p + "latency-devices"
    name = _get(
        cfg,
        key,
        "",
        str,
        lambda v: all(c.isalnum() or c in "._-" for c in v),
        'a node config device-class name (letters, digits, "._-") or "" (every node)',
    )
    resource = cfg.get(p + "resource", DecNASSettings.resource)
    if name and resource != "latency":
        raise ValueError(
            f"run config '{key}' = {name!r}: allowed with '{p}resource' = \"latency\" only "
            f"(it is {resource!r})"
        )
    return name


@dataclass(frozen=True)
class LatencySettings:
    """How nodes measure their latency tables when a method's ``resource`` is
    ``"latency"`` (``latency.*`` keys; ``docs/latency.md``): ``repeats`` timed rounds after
    ``warmup`` untimed calls per option, the ``statistic`` of the timed calls, and
    ``validation-paths`` subnets timed end to end against the table on each node."""

    repeats: int = DEFAULT_REPEATS
    warmup: int = DEFAULT_WARMUP
    statistic: str = DEFAULT_STATISTIC
    validation_paths: int = 20

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> LatencySettings:
        p = "latency."
        return cls(
            repeats=_get(cfg, p + "repeats", cls.repeats, int, lambda v: 1 <= v <= 1000, "1..1000"),
            warmup=_get(cfg, p + "warmup", cls.warmup, int, lambda v: 0 <= v <= 1000, "0..1000"),
            statistic=_one_of(cfg, p + "statistic", cls.statistic, tuple(STATISTICS)),
            validation_paths=_get(
                cfg,
                p + "validation-paths",
                cls.validation_paths,
                int,
                lambda v: 0 <= v <= 1000,
                "0..1000 (fewer than 2: no validation)",
            ),
        )

    def request(self, seed: int) -> LatencyRequest:
        """The ``query.latency`` request of a run seeded ``seed``."""
        return LatencyRequest(
            repeats=self.repeats,
            warmup=self.warmup,
            statistic=self.statistic,
            validation_paths=self.validation_paths,
            seed=seed,
        )


@dataclass(frozen=True)
class RunSettings:
    """Everything one run needs, parsed from the run config."""

    method: str = "fedoras"
    seed: int = 0
    output_dir: str = "outputs"
    reply_timeout: float = 600.0
    min_nodes: int = 2
    resume_from: str = ""
    checkpoint_every: int = 1
    # Every final model also as ONNX, checked in onnxruntime (export.py); false: .pt only.
    onnx: bool = True
    data: DataSpec = field(default_factory=DataSpec)
    space: SpaceSettings = field(default_factory=SpaceSettings)
    fedoras: FedorASSettings = field(default_factory=FedorASSettings)
    fdnas: FDNASSettings = field(default_factory=FDNASSettings)
    dpfnas: DPFNASSettings = field(default_factory=DPFNASSettings)
    decnas: DecNASSettings = field(default_factory=DecNASSettings)
    latency: LatencySettings = field(default_factory=LatencySettings)
    # Robust aggregation, every method (federation/aggregation.py, ``Aggregation``).
    aggregation: str = "mean"
    aggregation_trim: float = 0.2
    # Where loops compute (training.py ``torch_device``); a node's config wins.
    device: str = "auto"
    # On CUDA: deterministic kernels, TF32 off (training.py ``apply_determinism``).
    deterministic: bool = True
    # Every key the parser read and the value it took (given or default): what binds a
    # checkpoint to its run's settings (checkpoints.py, ``bound_settings``).
    # Not in result.json (``artifacts.plain``): the checkpoint keeps the bound part.
    values: Mapping[str, Any] = field(
        default_factory=dict, repr=False, compare=False, metadata={"document": False}
    )

    @property
    def output_path(self) -> Path:
        """The output directory as an absolute path (the ServerApp's cwd is the SuperLink's)."""
        return Path(self.output_dir).expanduser().resolve()


def parse_run_config(cfg: Mapping[str, Any]) -> RunSettings:
    """Turn a flat run config into validated ``RunSettings``.

    Raises
    ------
    ValueError
        Naming the key, the value and what is allowed; or naming an unknown key and
        the closest known one.
    """
    check_known_keys(cfg)
    token = _READ.set({})
    try:
        settings = _parse(cfg)
        read = dict(_READ.get() or {})
    finally:
        _READ.reset(token)
    read.update({f"data.{key}": value for key, value in settings.data.to_config().items()})
    return replace(settings, values=dict(sorted(read.items())))


#: Run-config keys a resume may change: they decide where files go and when they are
#: written (``output-dir``, ``resume-from``, ``checkpoint-every``, ``onnx``,
#: ``data.cache-dir``), where loops compute (``device``), how long the server waits
#: (``reply-timeout``, ``min-nodes``) and where a FedorAS run stops (``fedoras.stop-after``),
#: never what the weights, the history, the ledger or the privacy account hold.
RESUME_SAFE_KEYS = frozenset(
    {
        "output-dir",
        "resume-from",
        "fedoras.resume-from",
        "checkpoint-every",
        "onnx",
        "data.cache-dir",
        "device",
        "deterministic",
        "reply-timeout",
        "min-nodes",
        "fedoras.stop-after",
    }
)
#: method -> its run-config table; another method's table does not bind its checkpoints
METHOD_TABLES = {
    "fedoras": "fedoras.",
    "fdnas": "fdnas.",
    "cfdnas": "fdnas.",
    "dpfnas": "dpfnas.",
    "decnas": "decnas.",
}


def bound_settings(method: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """The run-config ``values`` (``RunSettings.values``) a checkpoint of ``method`` is bound
    to: all but ``RESUME_SAFE_KEYS`` and the keys of the other methods' tables."""
    own = METHOD_TABLES.get(method, f"{method}.")
    others = tuple(t for t in set(METHOD_TABLES.values()) if t != own)
    return {
        str(k): v
        for k, v in sorted(values.items())
        if k not in RESUME_SAFE_KEYS and not str(k).startswith(others)
    }


class _RecordingConfig(Mapping[str, Any]):
    """A run config that remembers every key looked up in it (``get``, ``in``, ``[]``)."""

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        self._cfg = dict(cfg)
        self.asked: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self.asked.add(key)
        return self._cfg[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._cfg)

    def __len__(self) -> int:
        return len(self._cfg)


@functools.cache
def known_keys() -> frozenset[str]:
    """Every run-config key the parser reads: the keys it looks up while parsing the
    defaults of each method, and ``data.<field>`` for every ``DataSpec`` field."""
    asked: set[str] = set()
    for method in METHODS:
        recording = _RecordingConfig({"method": method})
        _parse(recording)
        asked |= recording.asked
    return frozenset(asked | {f"data.{key}" for key in DataSpec().to_config()})


def check_known_keys(keys: Iterable[str]) -> None:
    """Raise ``ValueError`` if a key is not a run-config key, with the closest known one.

    Raises
    ------
    ValueError
        ``run config key 'fedoras.round' is unknown; did you mean 'fedoras.rounds'?``
        (one line per unknown key).
    """
    known = known_keys()
    unknown = sorted(set(keys) - known)
    if not unknown:
        return
    lines = []
    for key in unknown:
        close = _closest(key, sorted(known))
        if len(close) == 1:
            hint = f"did you mean {close[0]!r}?"
        elif close:
            hint = "did you mean one of " + ", ".join(map(repr, close)) + "?"
        else:
            hint = "the known keys are those of [tool.flwr.app.config] in pyproject.toml"
        lines.append(f"run config key {key!r} is unknown; {hint}")
    raise ValueError("\n".join(lines))


def _closest(key: str, known: list[str]) -> list[str]:
    """The closest known key (difflib); else the keys with the same last part (a missing or
    wrong table: ``rounds`` -> ``fdnas.rounds``, ``fedoras.rounds``)."""
    close = difflib.get_close_matches(key, known, n=1)
    if close:
        return close
    leaf = key.rsplit(".", 1)[-1]
    return [k for k in known if k.rsplit(".", 1)[-1] == leaf]


def _parse(cfg: Mapping[str, Any]) -> RunSettings:
    method = _get(
        cfg, "method", "fedoras", str, lambda v: v in METHODS, "one of " + ", ".join(METHODS)
    )
    seed = _get(cfg, "seed", 0, int, lambda v: 0 <= v < 2**32, "0 <= seed < 2**32")
    data_cfg = {k: v for k, v in cfg.items() if k.startswith("data.")}
    data_cfg.setdefault("data.seed", seed)
    return RunSettings(
        method=method,
        seed=seed,
        output_dir=_get(cfg, "output-dir", "outputs", str, lambda v: bool(v.strip()), "a path"),
        reply_timeout=_get(cfg, "reply-timeout", 600.0, float, _positive, "seconds > 0"),
        min_nodes=_get(cfg, "min-nodes", 2, int, _positive, ">= 1"),
        resume_from=_resume_from(cfg, method),
        checkpoint_every=_get(
            cfg, "checkpoint-every", 1, int, lambda v: v >= 0, ">= 0 (0: at stage ends only)"
        ),
        onnx=_get(cfg, "onnx", True, bool),
        data=DataSpec.from_config(data_cfg),
        space=SpaceSettings.from_config(cfg),
        fedoras=FedorASSettings.from_config(cfg),
        fdnas=FDNASSettings.from_config(cfg),
        dpfnas=DPFNASSettings.from_config(cfg),
        decnas=DecNASSettings.from_config(cfg),
        latency=LatencySettings.from_config(cfg),
        # Robust aggregation (one block; the values of ``federation.aggregation.AGGREGATIONS``).
        aggregation=_one_of(cfg, "aggregation", "mean", ("mean", "median", "trimmed-mean")),
        aggregation_trim=_get(
            cfg, "aggregation-trim", 0.2, float, lambda v: 0.0 <= v < 0.5, "0 <= trim < 0.5"
        ),
        # Device of every loop (auto = CUDA when present); a node config 'device' wins there.
        device=check_device_setting(_get(cfg, "device", "auto", str)),
        deterministic=_get(cfg, "deterministic", True, bool),
    )


def _resume_from(cfg: Mapping[str, Any], method: str) -> str:
    """Run config ``resume-from``; FedorAS's older ``fedoras.resume-from`` still counts."""
    path = _get(cfg, "resume-from", "", str).strip()
    old = _get(cfg, "fedoras.resume-from", "", str).strip()
    if old and method == "fedoras":
        if path and path != old:
            raise ValueError(
                f"run config 'fedoras.resume-from' = {old!r} and 'resume-from' = {path!r}: "
                "give only 'resume-from' (the older key is kept for FedorAS Stage-1 files)"
            )
        return old
    return path
