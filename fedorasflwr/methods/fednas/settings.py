"""FedNAS's settings: the ``fednas.*`` run-config keys, read and checked."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ...config import MethodSettings, Table, TrainingRecipe

__all__ = ["FedNASSettings"]


@dataclass(frozen=True)
class FedNASSettings(MethodSettings):
    """FedNAS hyper-parameters (``fednas.*`` keys; He et al., 2020, FedML's ``fednas``).

    Paper / FedML values (CIFAR-10, 16 clients): every client every round, 5 local
    epochs of first-order DARTS (w: SGD lr 0.025 momentum 0.9 weight decay 3e-4, cosine;
    alpha: Adam lr 3e-4, betas (0.5, 0.999), weight decay 1e-3), batch 64, 50 rounds.
    The defaults here are sized for a 2-core CPU and MNIST-5k.  ``search``: the search's
    recipe (``rounds``, ``clients-per-round``, ``local-epochs``, ``batch-size``,
    ``weight-lr``, ``weight-momentum``, ``weight-decay``, ``grad-clip``); ``final``: the
    derived net's FedAvg (``final-*``, as DP-FNAS's).  Both clip each step's weight
    gradient at L2 norm 5, as DARTS's search and augmentation scripts do (``--grad_clip
    5``); FedML's FedNAS (``--grad_clip`` 5) clips its derived net's training so, and in its
    search calls the clip on the alphas' gradients, which its weight step does not use.
    With the flatten head (issue 40) 9 of 15 unclipped derived nets diverged at lr 0.05.
    """

    TABLE: ClassVar[str] = "fednas."

    search: TrainingRecipe = TrainingRecipe(
        rounds=10,
        clients_per_round=0,
        local_epochs=1,
        batch_size=32,
        lr=0.05,
        momentum=0.9,
        grad_clip=5.0,
    )
    arch_lr: float = 3e-3
    arch_weight_decay: float = 1e-3
    eval_every: int = 1
    min_replies: int = 1
    final: TrainingRecipe = TrainingRecipe(
        rounds=5, clients_per_round=0, local_epochs=1, batch_size=32, lr=0.05, grad_clip=5.0
    )

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> FedNASSettings:
        p = cls.TABLE
        t = Table(cfg, p)
        return cls(
            search=TrainingRecipe.from_config(
                cfg,
                p,
                cls.search,
                names={"lr": "weight-lr", "momentum": "weight-momentum"},
                all_clients=True,
                min_rounds=1,
                grad_clip=True,
            ),
            arch_lr=t.number("arch-lr", cls.arch_lr),
            arch_weight_decay=t.number(
                "arch-weight-decay", cls.arch_weight_decay, lambda v: v >= 0, ">= 0"
            ),
            eval_every=t.count("eval-every", cls.eval_every, 0),
            min_replies=t.count("min-replies", cls.min_replies),
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
                grad_clip=True,
            ),
            **cls.shared_from_config(cfg),
        )
