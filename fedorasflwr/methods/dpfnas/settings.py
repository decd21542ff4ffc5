"""DP-FNAS's settings: the ``dpfnas.*`` run-config keys, read and checked."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ...config import MethodSettings, Table, TrainingRecipe

__all__ = ["DPFNASSettings"]


@dataclass(frozen=True)
class DPFNASSettings(MethodSettings):
    """DP-FNAS hyper-parameters (``dpfnas.*`` keys; Singh et al., 2020, Algorithm 1).

    Paper values (CIFAR-10, §4.1): sigma^2 = tau^2 = 1 (``noise-weights`` =
    ``noise-arch`` = 1), R_G = 0.01, R_H = 0.1, second-order architecture
    gradients, server steps ``W <- W - xi * sum_k G_k`` (``aggregation`` =
    "sum"), DARTS schedule (50 epochs, batch 64, w: lr 0.025 momentum 0.9;
    alpha: Adam 3e-4), final training 600 epochs.  The defaults here are sized
    for a 2-core CPU and MNIST-5k.  ``mode``: "dpfnas" (noise), "fnas" (no
    noise), "single" (one party, no noise: vanilla DARTS).  ``final-noise`` > 0
    makes the final FedAvg training DP-SGD (accounted with the search's W steps; it clips
    each sample at ``final-clip``); else its local SGD clips each step's gradient at
    ``final-grad-clip`` (DARTS's augmentation: 5).
    ``insecure_reproducible_noise``: parties seed their noise and Poisson samples from
    the run seed (reproducible runs) - the server can then subtract the noise, so the
    run gives no privacy against it; off by default (the OS CSPRNG, ``secure_random``).
    """

    TABLE: ClassVar[str] = "dpfnas."

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
        rounds=5, clients_per_round=0, local_epochs=1, batch_size=32, lr=0.05, grad_clip=5.0
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
        t = Table(cfg, p)

        number, count = t.number, t.count

        def non_negative(v: float) -> bool:
            return v >= 0

        def momentum(v: float) -> bool:
            return 0 <= v < 1

        return cls(
            mode=t.get(
                "mode",
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
            order=t.get("order", cls.order, int, lambda v: v in (1, 2), "1 or 2"),
            aggregation=t.get(
                "aggregation",
                cls.aggregation,
                str,
                lambda v: v in ("mean", "sum"),
                "mean or sum",
            ),
            target_epsilon=number(
                "target-epsilon", cls.target_epsilon, non_negative, ">= 0 (0: no target)"
            ),
            delta=number("delta", cls.delta, lambda v: 0 < v < 1, "0 < delta < 1"),
            accountant=t.get(
                "accountant",
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
                grad_clip=True,
            ),
            final_noise=number(
                "final-noise", cls.final_noise, non_negative, ">= 0 (0: not private)"
            ),
            final_clip=number("final-clip", cls.final_clip),
            insecure_reproducible_noise=t.get(
                "insecure-reproducible-noise", cls.insecure_reproducible_noise, bool
            ),
            **_latency(t),
            **cls.shared_from_config(cfg),
        )


def _latency(t: Table) -> dict[str, Any]:
    """``dpfnas.resource`` and ``dpfnas.latency-budget-ms`` (required with the latency)."""
    resource = t.one_of("resource", DPFNASSettings.resource, ("none", "latency"))
    budget = t.get("latency-budget-ms", 0.0, float, lambda v: v >= 0, "> 0 ms (0: unset)")
    if resource == "latency" and budget <= 0:
        p = t.prefix
        raise ValueError(
            f"run config '{p}latency-budget-ms' = {budget!r}: with '{p}resource' = 'latency' "
            "give the derived network's latency budget in milliseconds, > 0"
        )
    return {"resource": resource, "latency_budget_ms": budget}
