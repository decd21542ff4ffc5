"""The width baselines' settings: the ``heterofl.*`` and ``fjord.*`` run-config keys."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ...config import MethodSettings, Table, TrainingRecipe
from ...search_spaces.widths import parse_widths

__all__ = ["FjORDSettings", "HeteroFLSettings", "WidthSettings"]

#: the training recipe's keys in both tables
RECIPE_KEYS = ("rounds", "clients_per_round", "local_epochs", "batch_size", "lr", "momentum")


@dataclass(frozen=True)
class WidthSettings(MethodSettings):
    """What both width baselines share: ``train`` (``rounds`` of ``clients-per-round``
    clients, 0: every node, each ``local-epochs`` of SGD), ``tier_widths`` (the model
    width each tier gets, tier 0 the smallest) and ``min_replies`` per round.

    A node's tier: its node config ``tier`` (0 .. tiers - 1) where it declares one, else
    its partition id's share of the partitions: ``tier = partition_id * tiers //
    num_partitions`` (equal contiguous ranges, the last tier the largest model)."""

    train: TrainingRecipe = TrainingRecipe(
        rounds=10, clients_per_round=0, local_epochs=1, batch_size=32, lr=0.05
    )
    tier_widths: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
    min_replies: int = 1
    distill: bool = False  # FjORD's self-distillation (HeteroFL: never)

    @property
    def ladder(self) -> tuple[float, ...]:
        """Every width a client may train (HeteroFL: the tier widths)."""
        return self.tier_widths

    @classmethod
    def _common(cls, cfg: Mapping[str, Any], t: Table) -> dict[str, Any]:
        train = TrainingRecipe.from_config(
            cfg, t.prefix, cls.train, keys=RECIPE_KEYS, all_clients=True, min_rounds=1
        )
        shared = cls.shared_from_config(cfg)
        # a robust 'aggregation' is refused by the strategy (WidthStrategy), not here: the
        # run config is shared by every method's table, and another method may use it
        return {"train": train, "min_replies": t.min_replies(cls.min_replies, train), **shared}


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
