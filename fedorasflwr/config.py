"""Run config -> typed, validated settings: what every method shares.

Each method's own settings live in its folder (``methods/<method>/settings.py``, a
``MethodSettings`` reading its table through a ``Table``); ``parse_run_config`` reads the
shared keys, checks every method's table and keeps the running method's settings
(``RunSettings.method_settings``; ``methods.settings_class`` names the class).

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
from typing import Any, ClassVar

from .data import DatasetInfo, DataSpec
from .latency import DEFAULT_REPEATS, DEFAULT_STATISTIC, DEFAULT_WARMUP, STATISTICS, LatencyRequest
from .methods import METHODS, settings_class
from .search_spaces.cnn import DEFAULT_REDUCTION, HEADS, PAPER_REDUCTION, REDUCTIONS
from .training import check_device_setting

__all__ = [
    "METHODS",
    "Table",
    "MethodSettings",
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

SPACE_NAMES = ("cnn_l", "cnn_s", "rnn", "mbconv", "darts")
DEFAULT_HEADS = {"cnn_s": "flatten", "cnn_l": "flatten", "mbconv": "flatten", "darts": "flatten"}
"""The spaces with a ``space.head`` choice, and the head ``space.head = "auto"`` (the
default) gives each: flatten for all four (issue 40: with the papers' global average
pooling their nets train far slower under FedAvg on skewed clients; benchmarks/README.md,
space_ablation.py). ``cnn_s`` / ``cnn_l``: FedorAS's spaces. ``darts``: with the final
training's gradient clipped at norm 5, its derived nets train 17-19 pp better at Dirichlet
0.1 than with DARTS's GAP, and the quick FedNAS / DP-FNAS presets' nets go 0.59 -> 0.89,
0.63 -> 0.90. ``mbconv``: with FDNAS's weight steps clipped at norm 5 (``fdnas.grad-clip``,
default 5 since the head changed; without it the flatten head diverged in CFDNAS's
class-group preset at lr 0.1) its 6-layer nets are level with the hand-made ConvNet of the
same MACs at Dirichlet 0.1 (best / median +1.6 / +0.5 pp; GAP -13.9 / -16.2) and within 1.1
pp of it at 1.0 and IID (3 seeds), and the quick FDNAS preset's net goes 0.60 -> 0.84 (2
seeds; preset_variants.py)."""
HEAD_SPACES = tuple(DEFAULT_HEADS)
"""The spaces with a ``space.head`` choice."""
DEFAULT_LAYERS_PER_BLOCK = {"cnn_l": 2, "mbconv": 2, "darts": 4}
"""The spaces with a depth (``space.layers-per-block``: ``cnn_l``'s layers a block,
``mbconv``'s layers a stage, ``darts``' cells) and the depth ``space.layers-per-block =
"auto"`` (the default) gives each: ``darts`` 4 cells; ``mbconv`` 2 (6 searchable layers: at
the same MACs 12 train far slower under FedAvg on skewed clients with either head, and 6
with the flatten head about as fast as the width baselines' ConvNet); ``cnn_l`` 2 (6
searchable layers in its 3 blocks; the paper's App. E.3 has 4 a block: at the same MACs its
nets are within 1.2 pp of the ConvNet at the median of 5 at Dirichlet 1.0 and IID, where
12 layers' are 2.3 and 1.7 below, and level with 12's at 0.1; 3 seeds). Both: issue 40,
benchmarks/README.md, space_ablation.py."""
#: how an aggregation combines one key's updates (``federation.aggregation.Aggregation``)
AGGREGATION_RULES = ("mean", "median", "trimmed-mean")


def check_aggregation(
    rule: str, trim: float, rule_name: str = "aggregation", trim_name: str = "aggregation-trim"
) -> None:
    """Refuse an aggregation rule outside ``AGGREGATION_RULES`` or a trim outside
    ``[0, 0.5)``, naming them as ``rule_name`` / ``trim_name``."""
    if rule not in AGGREGATION_RULES:
        raise ValueError(f"{rule_name} {rule!r}: allowed: one of {', '.join(AGGREGATION_RULES)}")
    if not 0.0 <= trim < 0.5:
        raise ValueError(f"{trim_name} {trim!r}: allowed: 0 <= trim < 0.5")


def read_key(
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


#: While ``parse_run_config`` runs: every key ``read_key`` read, with the value it took (the
#: run config's or the default) -> ``RunSettings.values``.
_READ: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "run_config_read", default=None
)


def positive(value: float) -> bool:
    return value > 0


def unit_interval(value: float) -> bool:
    return 0.0 <= value <= 1.0


_RECIPE_KEYS = {
    "rounds": "rounds",
    "clients_per_round": "clients-per-round",
    "local_epochs": "local-epochs",
    "batch_size": "batch-size",
    "lr": "lr",
    "momentum": "momentum",
    "weight_decay": "weight-decay",
    "grad_clip": "grad-clip",
}
_DEFAULT_RECIPE_KEYS = tuple(k for k in _RECIPE_KEYS if k != "grad_clip")
"""The keys a stage reads unless it names its own: ``grad-clip`` only where the stage's
client side applies it (``training.local_sgd`` does)."""


@dataclass(frozen=True)
class TrainingRecipe:
    """One federated training recipe, the same type in every method and stage: ``rounds``
    of ``clients_per_round`` clients (0: every node), each running ``local_epochs`` of SGD
    (``batch_size``, ``lr``, ``momentum``, ``weight_decay``; ``grad_clip``: the max L2
    norm of each step's whole gradient, 0: none).

    Its run-config keys are the field names in kebab case under a stage's prefix
    (``fedoras.rounds``, ``fedoras.finetune-lr``, ``fdnas.final-local-epochs``, ...)."""

    rounds: int
    clients_per_round: int
    local_epochs: int = 1
    batch_size: int = 32
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.0
    grad_clip: float = 0.0

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
        if self.grad_clip:  # absent from the messages of a stage that does not clip
            config["grad-clip"] = self.grad_clip
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
        keys: Iterable[str] = _DEFAULT_RECIPE_KEYS,
        names: Mapping[str, str] | None = None,
        all_clients: bool = False,
        min_rounds: int = 0,
        grad_clip: bool = False,
    ) -> TrainingRecipe:
        """Read the fields in ``keys`` from ``<prefix><key>`` (``names`` renames a key);
        the others keep ``default``'s values.  ``all_clients``: 0 clients per round means
        every node; ``min_rounds`` 1: a stage that must run (0 rounds refused);
        ``grad_clip``: read ``<prefix>grad-clip`` too (a stage whose clients clip)."""
        names = {**_RECIPE_KEYS, **(names or {})}
        keys = (*keys, "grad_clip") if grad_clip else tuple(keys)
        low_clients = 0 if all_clients else 1
        checks: dict[str, tuple[type, Callable[[Any], bool], str]] = {
            "rounds": (int, lambda v: v >= min_rounds, f">= {min_rounds}"),
            "clients_per_round": (
                int,
                lambda v: v >= low_clients,
                ">= 0 (0: every node)" if all_clients else ">= 1",
            ),
            "local_epochs": (int, positive, ">= 1"),
            "batch_size": (int, positive, ">= 1"),
            "lr": (float, positive, "> 0"),
            "momentum": (float, lambda v: 0 <= v < 1, "0 <= m < 1"),
            "weight_decay": (float, lambda v: v >= 0, ">= 0"),
            "grad_clip": (float, lambda v: v >= 0, ">= 0 (0: no clipping)"),
        }
        values = {}
        for name in keys:
            kind, check, allowed = checks[name]
            values[name] = read_key(
                cfg, prefix + names[name], getattr(default, name), kind, check, allowed
            )
        return replace(default, **values)


@dataclass(frozen=True)
class SpaceSettings:
    """Which search space to build and how large (``space.*`` keys)."""

    name: str = "cnn_s"
    width: float = 0.5
    layers_per_block: int | str = "auto"  # auto: DEFAULT_LAYERS_PER_BLOCK
    blocks: int = 3  # cnn_l only
    head: str = "auto"  # cnn_s / cnn_l / mbconv / darts: auto (DEFAULT_HEADS) | flatten | gap
    # cnn_s: auto (DEFAULT_REDUCTION: maxpool-conv1x1) | conv1x1-avgpool (the paper's) |
    # maxpool-conv1x1; other spaces: auto only
    reduction: str = "auto"

    def resolved_head(self) -> str:
        """The head this space is built with: ``head``, or for ``"auto"`` the space's
        :data:`DEFAULT_HEADS` entry (``"flatten"`` for a space without a head choice)."""
        if self.head != "auto":
            return self.head
        return DEFAULT_HEADS.get(self.name, "flatten")

    def resolved_reduction(self) -> str:
        """The ``cnn_s`` reduction this space is built with: ``reduction``, or for ``"auto"``
        :data:`~fedorasflwr.search_spaces.cnn.DEFAULT_REDUCTION` (max pooling first)."""
        return DEFAULT_REDUCTION if self.reduction == "auto" else self.reduction

    def resolved_layers_per_block(self) -> int:
        """The depth this space is built with: ``layers_per_block``, or for ``"auto"`` the
        space's :data:`DEFAULT_LAYERS_PER_BLOCK` entry (4 for a space without a depth)."""
        if self.layers_per_block != "auto":
            return int(self.layers_per_block)
        return DEFAULT_LAYERS_PER_BLOCK.get(self.name, 4)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> SpaceSettings:
        name = read_key(
            cfg,
            "space.name",
            cls.name,
            str,
            lambda v: v in SPACE_NAMES,
            "one of " + ", ".join(SPACE_NAMES),
        )
        blocks = read_key(
            cfg, "space.blocks", cls.blocks, int, lambda v: 1 <= v <= 6, "1..6 (cnn_l blocks)"
        )
        if blocks != cls.blocks and name != "cnn_l":
            raise ValueError(
                f"run config 'space.blocks' = {blocks}: only the cnn_l space has a block count; "
                f"'space.name' = {name!r} (leave space.blocks at {cls.blocks})"
            )
        head = read_key(
            cfg,
            "space.head",
            cls.head,
            str,
            lambda v: v in ("auto", *HEADS),
            "one of auto, " + ", ".join(HEADS),
        )
        if head != cls.head and name not in HEAD_SPACES:
            raise ValueError(
                f"run config 'space.head' = {head!r}: only the {', '.join(HEAD_SPACES)} "
                f"spaces have a head choice; 'space.name' = {name!r} "
                f"(leave space.head at {cls.head!r})"
            )
        reduction = read_key(
            cfg,
            "space.reduction",
            cls.reduction,
            str,
            lambda v: v in ("auto", *REDUCTIONS),
            "one of auto, " + ", ".join(REDUCTIONS),
        )
        if reduction != cls.reduction and name != "cnn_s":
            raise ValueError(
                f"run config 'space.reduction' = {reduction!r}: only the cnn_s space has a "
                f"reduction choice; 'space.name' = {name!r} (leave space.reduction at "
                f"{cls.reduction!r})"
            )
        return cls(
            name=name,
            blocks=blocks,
            head=head,
            reduction=reduction,
            width=read_key(
                cfg, "space.width", cls.width, float, lambda v: 0 < v <= 4, "0 < width <= 4"
            ),
            layers_per_block=read_key(
                cfg,
                "space.layers-per-block",
                cls.layers_per_block,
                str if cfg.get("space.layers-per-block", "auto") == "auto" else int,
                lambda v: v == "auto" or 1 <= v <= 8,
                "auto or 1..8 (cnn_l blocks, mbconv stages, darts cells)",
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
        kwargs["layers_per_block"] = space.resolved_layers_per_block()
        kwargs["blocks"] = space.blocks
    if space.name in HEAD_SPACES:
        kwargs["head"] = space.resolved_head()
    if space.name == "cnn_s":
        kwargs["reduction"] = space.resolved_reduction()
    if space.name == "mbconv":
        kwargs["layers_per_stage"] = space.resolved_layers_per_block()
    if space.name == "darts":
        # C = 8 x width (DARTS: 16); inputs above 16 px are halved by the stem (CPU-sized).
        del kwargs["width"]
        kwargs.update(
            channels=max(2, round(8 * space.width)),
            cells=space.resolved_layers_per_block(),
            stem_stride=2 if height > 16 else 1,
        )
    return kwargs


def read_min_replies(cfg: Mapping[str, Any], p: str, default: int, train: TrainingRecipe) -> int:
    """``<p>min-replies``, at most the recipe's clients per round."""
    min_replies = read_key(cfg, p + "min-replies", default, int, positive, ">= 1")
    if train.clients_per_round and min_replies > train.clients_per_round:
        raise ValueError(
            f"run config '{p}min-replies' = {min_replies} exceeds "
            f"'{p}clients-per-round' = {train.clients_per_round}"
        )
    return min_replies


def check_table(cfg: Mapping[str, Any], prefix: str) -> None:
    """Refuse a key of ``cfg`` in this table (``<prefix>...``) that no parser reads, with the
    closest known key: a library user's own run config may hold keys of its own, but a
    misspelled ``fedoras.round`` must not pass silently."""
    ours = [k for k in cfg if k.startswith(prefix)]
    if ours:  # (never while known_keys() itself parses: its configs hold no table keys)
        check_known_keys(ours)


def one_of(cfg: Mapping[str, Any], key: str, default: str, allowed: tuple[str, ...]) -> str:
    return read_key(cfg, key, default, str, lambda v: v in allowed, "one of " + ", ".join(allowed))


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
            repeats=read_key(
                cfg, p + "repeats", cls.repeats, int, lambda v: 1 <= v <= 1000, "1..1000"
            ),
            warmup=read_key(
                cfg, p + "warmup", cls.warmup, int, lambda v: 0 <= v <= 1000, "0..1000"
            ),
            statistic=one_of(cfg, p + "statistic", cls.statistic, tuple(STATISTICS)),
            validation_paths=read_key(
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


class Table:
    """One run-config table of a method (its keys ``<prefix><key>``), read and checked.

    Constructing it refuses a key of the table that no parser reads (``check_table``);
    each reader takes the key without the prefix and raises ``ValueError`` naming the
    whole key, the value and what is allowed (``read_key``)."""

    def __init__(self, cfg: Mapping[str, Any], prefix: str) -> None:
        check_table(cfg, prefix)
        self.cfg, self.prefix = cfg, prefix

    def get(self, key: str, default: Any, kind: type, *checked: Any) -> Any:
        """``<prefix><key>`` as ``kind``; ``checked``: a check and what it allows
        (``read_key``)."""
        return read_key(self.cfg, self.prefix + key, default, kind, *checked)

    def number(
        self, key: str, default: float, check: Callable[[float], bool] = positive, allowed="> 0"
    ) -> float:
        """A float (an int is accepted), by default > 0."""
        return self.get(key, default, float, check, allowed)

    def count(self, key: str, default: int, low: int = 1) -> int:
        """An int of at least ``low``."""
        return self.get(key, default, int, lambda v: v >= low, f">= {low}")

    def flag(self, key: str, default: bool) -> bool:
        return self.get(key, default, bool)

    def one_of(self, key: str, default: str, allowed: tuple[str, ...]) -> str:
        return one_of(self.cfg, self.prefix + key, default, allowed)

    def numbers(
        self,
        key: str,
        default: str,
        kind: type,
        check: Callable[[Any], bool],
        allowed: str,
        *,
        required: bool = False,
    ) -> tuple[Any, ...]:
        """Comma-separated ``kind`` values given as text (``"0.35,0.2"``; ``""``: none, refused
        when ``required``), each passing ``check``; else ``ValueError`` naming the key, the
        text and ``allowed``."""
        text = self.get(key, default, str).strip()
        try:
            values = tuple(kind(v) for v in text.split(",")) if text else ()
        except ValueError:
            values = (None,)
        if (required and not values) or not all(v is not None and check(v) for v in values):
            raise ValueError(f"run config '{self.prefix}{key}' = {text!r}: {allowed}")
        return values

    def min_replies(self, default: int, train: TrainingRecipe) -> int:
        """``<prefix>min-replies``, at most the recipe's clients per round."""
        return read_min_replies(self.cfg, self.prefix, default, train)


@dataclass(frozen=True)
class MethodSettings:
    """What every method's settings share: its run-config table and robust aggregation.

    A method's settings class (``methods/<method>/settings.py``) subclasses it, names its
    run-config table (``TABLE``, e.g. ``"fedoras."``) and the keys of that table a resume may
    change (``RESUME_SAFE``), and reads its keys in ``from_config``.

    ``aggregation_rule`` / ``aggregation_trim`` (run config ``aggregation``,
    ``aggregation-trim``): how every aggregation of the method combines one key's updates,
    ``"mean"`` (weighted by the counts), ``"median"`` or ``"trimmed-mean"``
    (``federation.aggregation.Aggregation``). Checked on construction.
    """

    #: the method's run-config table (its keys' prefix)
    TABLE: ClassVar[str] = ""
    #: keys of the table a resume may change (``bound_settings``)
    RESUME_SAFE: ClassVar[frozenset[str]] = frozenset()

    aggregation_rule: str = "mean"
    aggregation_trim: float = 0.2

    def __post_init__(self) -> None:
        name = type(self).__name__
        check_aggregation(
            self.aggregation_rule,
            self.aggregation_trim,
            f"{name}.aggregation_rule =",
            f"{name}.aggregation_trim =",
        )

    @staticmethod
    def shared_from_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
        """The shared fields from the run config's top-level keys."""
        return {
            "aggregation_rule": one_of(cfg, "aggregation", "mean", AGGREGATION_RULES),
            "aggregation_trim": read_key(
                cfg, "aggregation-trim", 0.2, float, lambda v: 0.0 <= v < 0.5, "0 <= trim < 0.5"
            ),
        }


@dataclass(frozen=True)
class RunSettings:
    """Everything one run needs, parsed from the run config: what every method shares, and
    the running method's own settings (``method_settings``, of its class in
    ``methods/<method>/settings.py``)."""

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
    # The running method's settings (None: the method's defaults, filled in on construction).
    method_settings: Any = None
    latency: LatencySettings = field(default_factory=LatencySettings)
    # Where loops compute (training.py ``torch_device``); a node's config wins.
    device: str = "auto"
    # On CUDA: deterministic kernels, TF32 off (training.py ``apply_determinism``).
    deterministic: bool = True
    # ``rounds-scale``: "auto" (the rounds rule, ``fedorasflwr.rounds``) or a number > 0 that
    # multiplies every round key of the method; applied by ``rounds.parse_with_rounds_rule``.
    rounds_scale: float | str = "auto"
    # What the rounds rule did (``rounds.RoundsRule.summary``): None where it was not applied
    # (a bare ``parse_run_config``).
    rounds_rule: Mapping[str, Any] | None = None
    # Every key the parser read and the value it took (given or default): what binds a
    # checkpoint to its run's settings (checkpoints.py, ``bound_settings``).
    # Not in result.json (``artifacts.plain``): the checkpoint keeps the bound part.
    values: Mapping[str, Any] = field(
        default_factory=dict, repr=False, compare=False, metadata={"document": False}
    )

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(
                f"RunSettings.method = {self.method!r}: allowed: one of {', '.join(METHODS)}"
            )
        expected = settings_class(self.method)
        if self.method_settings is None:
            object.__setattr__(self, "method_settings", expected())
        elif not isinstance(self.method_settings, expected):
            raise ValueError(
                f"RunSettings.method_settings of method {self.method!r} must be a "
                f"{expected.__name__}, not {type(self.method_settings).__name__}"
            )

    @property
    def output_path(self) -> Path:
        """The output directory as an absolute path (the ServerApp's cwd is the SuperLink's)."""
        return Path(self.output_dir).expanduser().resolve()

    def document(self) -> dict[str, Any]:
        """The settings as result.json holds them: snake_case fields, the running method's
        settings under its run-config table's name (``fedoras``, ``fdnas``, ...)."""
        from .artifacts import plain

        table = type(self.method_settings).TABLE.rstrip(".")
        document: dict[str, Any] = {}
        for key, value in plain(self).items():
            document[table if key == "method_settings" else key] = value
        return document


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
#: ``data.cache-dir``), where loops compute (``device``, ``deterministic``) and how long the
#: server waits (``reply-timeout``, ``min-nodes``), never what the weights, the history, the
#: ledger or the privacy account hold.  A method adds its own (``MethodSettings.RESUME_SAFE``).
RESUME_SAFE_KEYS = frozenset(
    {
        "output-dir",
        "resume-from",
        "checkpoint-every",
        "onnx",
        "data.cache-dir",
        "device",
        "deterministic",
        "reply-timeout",
        "min-nodes",
        # its effect is in the round keys, which bind (``rounds.parse_with_rounds_rule``)
        "rounds-scale",
    }
)


def resume_safe_keys(method: str) -> frozenset[str]:
    """The run-config keys a resume of ``method`` may change."""
    return RESUME_SAFE_KEYS | settings_class(method).RESUME_SAFE


def bound_settings(method: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """The run-config ``values`` (``RunSettings.values``) a checkpoint of ``method`` is bound
    to: all but the keys a resume may change (``resume_safe_keys``) and the keys of the
    other methods' tables."""
    safe = resume_safe_keys(method)
    own = settings_class(method).TABLE
    others = tuple({settings_class(m).TABLE for m in METHODS} - {own})
    # the global test set off is the data as it was before its keys existed: a checkpoint
    # written then binds neither, and resumes
    if not values.get("data.global-test", False):
        safe = safe | {"data.global-test", "data.global-test-fraction"}
    if not values.get("data.partition-size", 0):  # likewise: unused, as before it existed
        safe = safe | {"data.partition-size"}
    if values.get(f"{own}lr-probe") is False:  # likewise: lr as given, as before the probe
        safe = safe | {f"{own}lr-probe"}
    if values.get(f"{own}head") == "flatten":  # likewise: the ConvNet's head before the key
        safe = safe | {f"{own}head"}
    # likewise cnn_s with the paper's reduction, as before the key, and every other space
    # (no reduction to choose: FedorAS alone builds space.name, the other methods their own
    # space); "auto" on cnn_s is bound as the reduction it builds
    reduction = values.get("space.reduction", "auto")
    builds_cnn_s = method == "fedoras" and values.get("space.name", "cnn_s") == "cnn_s"
    if not builds_cnn_s or reduction == PAPER_REDUCTION:
        safe = safe | {"space.reduction"}
    bound = {
        str(k): v
        for k, v in sorted(values.items())
        if k not in safe and not str(k).startswith(others)
    }
    # "auto" is bound as "flatten", what every checkpoint written before "auto" names (the
    # default then: cnn_s / cnn_l flatten, mbconv GAP, the head it could not change). The
    # space spec, checked beside the settings, tells an mbconv with "flatten" from "auto".
    if bound.get("space.head") == "auto":
        bound["space.head"] = "flatten"
    # likewise "auto" depth as 4, the default before "auto" (darts: the depth it gives it);
    # the space spec tells an mbconv or cnn_l of 2 layers from one of 4
    if bound.get("space.layers-per-block") == "auto":
        bound["space.layers-per-block"] = 4
    if bound.get("space.reduction") == "auto":  # as a checkpoint that set it names it
        bound["space.reduction"] = DEFAULT_REDUCTION
    return bound


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


def check_known_keys(keys: Iterable[str], known: Iterable[str] | None = None) -> None:
    """Raise ``ValueError`` if a key is not a run-config key, with the closest known one.

    `known` is the set of keys an app accepts (another Flower app's own
    ``[tool.flwr.app.config]``); ``None``: this package's (`known_keys`).

    Raises
    ------
    ValueError
        ``run config key 'fedoras.round' is unknown; did you mean 'fedoras.rounds'?``
        (one line per unknown key).
    """
    known = known_keys() if known is None else frozenset(known)
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
    method = read_key(
        cfg, "method", "fedoras", str, lambda v: v in METHODS, "one of " + ", ".join(METHODS)
    )
    seed = read_key(cfg, "seed", 0, int, lambda v: 0 <= v < 2**32, "0 <= seed < 2**32")
    data_cfg = {k: v for k, v in cfg.items() if k.startswith("data.")}
    data_cfg.setdefault("data.seed", seed)
    # Every method's table is checked (a bad value fails whichever method runs); only the
    # running method's settings are kept.
    tables = {m: settings_class(m) for m in METHODS}
    own = tables[method].from_config(cfg)
    for other in {cls for m, cls in tables.items() if cls is not tables[method]}:
        other.from_config(cfg)
    return RunSettings(
        method=method,
        seed=seed,
        output_dir=read_key(cfg, "output-dir", "outputs", str, lambda v: bool(v.strip()), "a path"),
        reply_timeout=read_key(cfg, "reply-timeout", 600.0, float, positive, "seconds > 0"),
        min_nodes=read_key(cfg, "min-nodes", 2, int, positive, ">= 1"),
        resume_from=_resume_from(cfg, own),
        checkpoint_every=read_key(
            cfg, "checkpoint-every", 1, int, lambda v: v >= 0, ">= 0 (0: at stage ends only)"
        ),
        onnx=read_key(cfg, "onnx", True, bool),
        data=DataSpec.from_config(data_cfg),
        space=SpaceSettings.from_config(cfg),
        method_settings=own,
        latency=LatencySettings.from_config(cfg),
        # Device of every loop (auto = CUDA when present); a node config 'device' wins there.
        device=check_device_setting(read_key(cfg, "device", "auto", str)),
        deterministic=read_key(cfg, "deterministic", True, bool),
        rounds_scale=_rounds_scale(cfg),
    )


#: ``rounds-scale``'s values: the rule (docs/running.md, "The rounds rule") or a factor
ROUNDS_SCALE_ALLOWED = '"auto" (the rounds rule) or a number > 0 (every round key times it)'


def _rounds_scale(cfg: Mapping[str, Any]) -> float | str:
    if isinstance(cfg.get("rounds-scale", "auto"), str):
        return read_key(
            cfg, "rounds-scale", "auto", str, lambda v: v == "auto", ROUNDS_SCALE_ALLOWED
        )
    return read_key(cfg, "rounds-scale", 1.0, float, positive, ROUNDS_SCALE_ALLOWED)


def _resume_from(cfg: Mapping[str, Any], own: MethodSettings) -> str:
    """Run config ``resume-from``; a method table's older ``resume-from`` key
    (``fedoras.resume-from``, the method settings' ``resume_from``) still counts."""
    path = read_key(cfg, "resume-from", "", str).strip()
    old = str(getattr(own, "resume_from", "") or "").strip()
    if old:
        key = f"{type(own).TABLE}resume-from"
        if path and path != old:
            raise ValueError(
                f"run config '{key}' = {old!r} and 'resume-from' = {path!r}: "
                f"give only 'resume-from' (the older key is kept for earlier files)"
            )
        return old
    return path


#: names that lived here until 0.1.0 and moved (old name -> ``module:name``): still
#: importable from here, with a ``DeprecationWarning``, until 0.5.0 (CHANGELOG.md)
MOVED = {
    "FedorASSettings": "fedorasflwr.methods.fedoras.settings:FedorASSettings",
    "FDNASSettings": "fedorasflwr.methods.fdnas.settings:FDNASSettings",
    "DPFNASSettings": "fedorasflwr.methods.dpfnas.settings:DPFNASSettings",
    "DecNASSettings": "fedorasflwr.methods.decnas.settings:DecNASSettings",
    "FEDORAS_STAGES": "fedorasflwr.methods.fedoras.settings:STAGES",
    "DECNAS_VARIANTS": "fedorasflwr.methods.decnas.settings:VARIANTS",
}


def __getattr__(name: str) -> Any:
    """A name in ``MOVED``, from its new home, with a ``DeprecationWarning`` saying where;
    the public path of each settings class is ``fedorasflwr.strategies``."""
    target = MOVED.get(name)
    if target is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module_name, attribute = target.split(":")
    import importlib
    import warnings

    warnings.warn(
        f"fedorasflwr.config.{name} moved to {module_name}.{attribute} in 0.2.0 "
        f"(settings classes: import them from fedorasflwr.strategies); the old path goes "
        f"in 0.5.0",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(module_name), attribute)
