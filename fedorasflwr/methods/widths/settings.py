"""The width baselines' settings: the ``heterofl.*`` and ``fjord.*`` run-config keys."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ...config import MethodSettings, Table, TrainingRecipe
from ...search_spaces.prunable_nets import CONVNET_HEADS
from ...search_spaces.widths import parse_widths

__all__ = ["FjORDSettings", "HeteroFLSettings", "WidthSettings"]

#: the training recipe's keys in both tables
RECIPE_KEYS = ("rounds", "clients_per_round", "local_epochs", "batch_size", "lr", "momentum")


def _check_widths(field: str, widths: Any) -> None:
    """Refuse ``widths`` unless a non-empty tuple of numbers in (0, 1], strictly increasing
    (what ``parse_widths`` reads from the run config), naming ``field``."""
    ok = (
        isinstance(widths, tuple)
        and len(widths) > 0
        and all(isinstance(w, int | float) and not isinstance(w, bool) for w in widths)
        and all(0 < w <= 1 for w in widths)
        and all(a < b for a, b in zip(widths, widths[1:], strict=False))
    )
    if not ok:
        raise ValueError(
            f"{field} = {widths!r}: allowed: a tuple of widths in (0, 1], strictly "
            "increasing, e.g. (0.25, 0.5, 1.0)"
        )


@dataclass(frozen=True)
class WidthSettings(MethodSettings):
    """What both width baselines share: ``train`` (``rounds`` of ``clients-per-round``
    clients, 0: every node, each ``local-epochs`` of SGD), ``tier_widths`` (the model
    width each tier gets, the smallest first) and ``min_replies`` per round.
    ``aggregation_rule`` (run config ``aggregation``) combines each entry over the clients
    whose slice holds it: ``"mean"`` weighted by their examples (the papers'), or the
    robust, unweighted ``"median"`` / ``"trimmed-mean"`` (``aggregation_trim``).

    A node's tier: its node config ``tier`` (1 .. tiers, 1 = the smallest, as for FedorAS)
    where it declares one, else its partition id's share of the partitions: ``tier = 1 +
    partition_id * tiers // num_partitions`` (equal contiguous ranges, the last tier the
    largest model).

    ``lr_probe`` (run config ``<method>.lr-probe``, default true): before round 1 the
    server halves ``lr`` until the full-width model's first SGD steps on its slice stay
    bounded (``runs.probed_recipe``): the rate the presets chose on MNIST leaves the
    ConvNet at chance on harder data (issue 40).

    ``head`` (run config ``<method>.head``): how the built-in ConvNet's classifier reads
    its last map, ``"flatten-scaled"`` (the default since 2026-12-07: divided by the
    square root of its positions, ``prunable_nets.ConvNet``) or ``"flatten"`` (DecNAS's
    ConvNet as the paper has it, the default before); ignored with a ``model_fn`` of the
    user's own."""

    train: TrainingRecipe = TrainingRecipe(
        rounds=10, clients_per_round=0, local_epochs=1, batch_size=32, lr=0.05
    )
    tier_widths: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
    min_replies: int = 1
    distill: bool = False  # FjORD's self-distillation (HeteroFL: never)
    lr_probe: bool = True
    head: str = "flatten-scaled"

    def __post_init__(self) -> None:
        super().__post_init__()
        name = type(self).__name__
        if self.head not in CONVNET_HEADS:
            raise ValueError(f"{name}.head = {self.head!r}: allowed: {', '.join(CONVNET_HEADS)}")
        _check_widths(f"{name}.tier_widths", self.tier_widths)
        if self.ladder != self.tier_widths:  # FjORD: its ladder, holding every p_max
            _check_widths(f"{name}.widths", self.ladder)
            if not set(self.tier_widths) <= set(self.ladder):
                raise ValueError(
                    f"{name}.tier_widths = {self.tier_widths!r}: allowed: widths of "
                    f"{name}.widths {self.ladder!r}"
                )

    @property
    def ladder(self) -> tuple[float, ...]:
        """Every width a client may train (HeteroFL: the tier widths)."""
        return self.tier_widths

    @classmethod
    def _common(cls, cfg: Mapping[str, Any], t: Table) -> dict[str, Any]:
        train = TrainingRecipe.from_config(
            cfg, t.prefix, cls.train, keys=RECIPE_KEYS, all_clients=True, min_rounds=1
        )
        shared = cls.shared_from_config(cfg)  # 'aggregation': each entry over its holders
        return {
            "train": train,
            "min_replies": t.min_replies(cls.min_replies, train),
            "lr_probe": t.flag("lr-probe", cls.lr_probe),
            "head": t.one_of("head", cls.head, CONVNET_HEADS),
            **shared,
        }


@dataclass(frozen=True)
class HeteroFLSettings(WidthSettings):
    """HeteroFL (Diao et al., 2021): ``heterofl.widths``, one static width per tier
    (the paper's a-e levels are 1, 1/2, 1/4, 1/8, 1/16 of the channels)."""

    TABLE: ClassVar[str] = "heterofl."

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> HeteroFLSettings:
        t = Table(cfg, cls.TABLE)
        widths = parse_widths(t.get("widths", "0.25,0.5,0.75,1.0", str), "heterofl.widths")
        return cls(tier_widths=widths, **cls._common(cfg, t))


@dataclass(frozen=True)
class FjORDSettings(WidthSettings):
    """FjORD (Horvath et al., 2021): ordered dropout over ``fjord.widths`` (the ladder of
    p values; the paper's is 0.2, 0.4, ..., 1.0), each tier's p_max in
    ``fjord.tier-widths`` (each one of the ladder); ``fjord.distill``: the paper's
    optional self-distillation (the p_max model teaches the sampled width)."""

    TABLE: ClassVar[str] = "fjord."

    widths: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)

    @property
    def ladder(self) -> tuple[float, ...]:
        return self.widths

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> FjORDSettings:
        t = Table(cfg, cls.TABLE)
        ladder = parse_widths(t.get("widths", "0.25,0.5,0.75,1.0", str), "fjord.widths")
        text = t.get("tier-widths", "0.25,0.5,0.75,1.0", str)
        tiers = parse_widths(text, "fjord.tier-widths")
        if not set(tiers) <= set(ladder):
            raise ValueError(
                f"run config 'fjord.tier-widths' = {text!r}: allowed: widths of "
                f"'fjord.widths' ({', '.join(map(str, ladder))})"
            )
        distill = t.flag("distill", cls.distill)
        return cls(widths=ladder, tier_widths=tiers, distill=distill, **cls._common(cfg, t))
