"""Run config -> typed, validated settings.

The run config (``[tool.flwr.app.config]`` in ``pyproject.toml``, overridable
with ``flwr run . --run-config "k=v"``) arrives flattened: the sub-table
``[tool.flwr.app.config.fedoras]`` becomes ``fedoras.<key>``.  Everything is
checked here, before any training, and a bad value raises ``ValueError``
naming the key, the value and what is allowed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .data import DatasetInfo, DataSpec

__all__ = [
    "METHODS",
    "FedorASSettings",
    "RunSettings",
    "SpaceSettings",
    "parse_run_config",
    "space_kwargs",
]

METHODS = ("fedoras",)
SPACE_NAMES = ("cnn_l", "cnn_s", "rnn")


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
    return value


def _positive(value: float) -> bool:
    return value > 0


def _unit_interval(value: float) -> bool:
    return 0.0 <= value <= 1.0


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
                "1..8 (cnn_l only)",
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
    return kwargs


@dataclass(frozen=True)
class FedorASSettings:
    """FedorAS Stage 1 hyper-parameters (``fedoras.*`` keys).

    Paper values (CIFAR-10, Tables 9-10): 500 rounds, 10 clients per round,
    50 local epochs, SGD lr 0.1 momentum 0.9, batch 128, communication budget
    half the supernet, 4 tiers with rho = [0.0, 0.95], 100K sampled paths.
    The defaults here are sized for a 2-core CPU.
    """

    num_tiers: int = 4
    rho_low: float = 0.0
    rho_high: float = 0.95
    tier_samples: int = 20_000
    tier_proportions: tuple[float, ...] = ()
    rounds: int = 20
    clients_per_round: int = 10
    local_epochs: int = 5
    batch_size: int = 32
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 0.0
    comm_budget: float = 0.5
    eval_every: int = 1
    eval_paths: int = 8
    min_replies: int = 2

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> FedorASSettings:
        p = "fedoras."
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
        clients = _get(cfg, p + "clients-per-round", cls.clients_per_round, int, _positive, ">= 1")
        min_replies = _get(cfg, p + "min-replies", cls.min_replies, int, _positive, ">= 1")
        if min_replies > clients:
            raise ValueError(
                f"run config '{p}min-replies' = {min_replies} exceeds "
                f"'{p}clients-per-round' = {clients}"
            )
        return cls(
            num_tiers=num_tiers,
            rho_low=rho_low,
            rho_high=rho_high,
            tier_samples=_get(
                cfg, p + "tier-samples", cls.tier_samples, int, lambda v: v >= 100, ">= 100"
            ),
            tier_proportions=proportions,
            rounds=_get(cfg, p + "rounds", cls.rounds, int, lambda v: v >= 0, ">= 0"),
            clients_per_round=clients,
            local_epochs=_get(cfg, p + "local-epochs", cls.local_epochs, int, _positive, ">= 1"),
            batch_size=_get(cfg, p + "batch-size", cls.batch_size, int, _positive, ">= 1"),
            lr=_get(cfg, p + "lr", cls.lr, float, _positive, "> 0"),
            momentum=_get(
                cfg, p + "momentum", cls.momentum, float, lambda v: 0 <= v < 1, "0 <= m < 1"
            ),
            weight_decay=_get(
                cfg, p + "weight-decay", cls.weight_decay, float, lambda v: v >= 0, ">= 0"
            ),
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
        )


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
class RunSettings:
    """Everything one run needs, parsed from the run config."""

    method: str = "fedoras"
    seed: int = 0
    output_dir: str = "outputs"
    reply_timeout: float = 600.0
    min_nodes: int = 2
    data: DataSpec = field(default_factory=DataSpec)
    space: SpaceSettings = field(default_factory=SpaceSettings)
    fedoras: FedorASSettings = field(default_factory=FedorASSettings)

    @property
    def output_path(self) -> Path:
        """The output directory as an absolute path (the ServerApp's cwd is the SuperLink's)."""
        return Path(self.output_dir).expanduser().resolve()


def parse_run_config(cfg: Mapping[str, Any]) -> RunSettings:
    """Turn a flat run config into validated ``RunSettings``.

    Raises
    ------
    ValueError
        Naming the key, the value and what is allowed.
    """
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
        data=DataSpec.from_config(data_cfg),
        space=SpaceSettings.from_config(cfg),
        fedoras=FedorASSettings.from_config(cfg),
    )
