"""FDNAS's and CFDNAS's settings: the ``fdnas.*`` run-config keys, read and checked."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from ...config import MethodSettings, Table, TrainingRecipe, positive

__all__ = ["FDNASSettings"]


@dataclass(frozen=True)
class FDNASSettings(MethodSettings):
    """FDNAS / CFDNAS hyper-parameters (``fdnas.*`` keys).

    Paper values (CIFAR-10, Zhang et al. 2020): 125 search rounds of 10
    clients, 5 local epochs, batch 256, SGD lr 0.05 cosine, momentum 0.9,
    weight decay 3e-4 for w; Adam without weight decay for alpha (ProxylessNAS:
    lr 6e-3, betas (0, 0.999)); 90/10 train/validation split; CFDNAS 25 rounds
    per cluster; the derived net trained with FedAvg for 250 rounds.  The
    hardware term is ``CE + beta log(E[FLOPs] / target)^2`` (two-sided; ``hardware_loss =
    "log-gap"``) or, as FDNAS's released code, ProxylessNAS's ``add#linear``
    ``CE + lambda (E[FLOPs] - target) / target`` (``"add-linear"``, lambda 0.05, with an
    alpha step every 5 weight steps, ``alpha_every``); targets are
    fractions of the supernet's largest path, as is ``max_flops``, the hard bound on every
    derived net.  The derived net is pulled toward its stage's target: a path loses
    ``derive_beta log(FLOPs / target)^2`` nats of log-probability (``add-linear``: above the
    target only; ``derivation.derive_toward``; 0: plain argmax), within ``max_flops``.
    Defaults are sized for a 2-core CPU.  ``resource = "latency"``: the hardware term uses
    the expected latency on the nodes' measured tables instead, with targets in milliseconds
    (``target_ms``, ``cluster_target_ms``), which also bound the derived nets.
    """

    TABLE: ClassVar[str] = "fdnas."

    # grad_clip 5 (DARTS's value; the paper has none): the mbconv space's flatten head
    # (issue 40) diverged at lr 0.1 on class-group clients without it
    train: TrainingRecipe = TrainingRecipe(
        rounds=10,
        clients_per_round=10,
        local_epochs=1,
        batch_size=32,
        lr=0.05,
        weight_decay=3e-4,
        grad_clip=5.0,
    )
    alpha_lr: float = 6e-3
    alpha_every: int = 1
    warmup_rounds: int = 0
    target_flops: float = 0.5
    max_flops: float = 1.0
    hardware_loss: str = "log-gap"
    hardware_beta: float = 1.0
    hardware_lambda: float = 0.05
    derive_beta: float = 20.0
    num_clusters: int = 3
    cluster_rounds: int = 3
    cluster_target_flops: tuple[float, ...] = (0.35,)
    # The derived net's FedAvg: clients, batch, momentum, weight decay and gradient clipping
    # are the search's.
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
        t = Table(cfg, p)
        fraction = (lambda v: 0 < v <= 1, "fraction of the largest path's FLOPs, 0 < f <= 1")
        # the search runs; grad-clip: every stage's (search, clusters, final training)
        train = TrainingRecipe.from_config(cfg, p, cls.train, min_rounds=1, grad_clip=True)
        min_replies = t.min_replies(cls.min_replies, train)
        targets = t.numbers(
            "cluster-target-flops",
            "0.35",
            float,
            lambda v: 0 < v <= 1,
            "comma-separated fractions in (0, 1], one for every cluster or one per cluster "
            "(in cluster order)",
            required=True,
        )
        return cls(
            train=train,
            alpha_lr=t.number("alpha-lr", cls.alpha_lr),
            alpha_every=t.get(
                "alpha-every", cls.alpha_every, int, lambda v: v >= 0, ">= 0 (0: never)"
            ),
            warmup_rounds=t.get(
                "warmup-rounds",
                cls.warmup_rounds,
                int,
                lambda v: v == 0 or 0 < v < train.rounds,
                f"0 <= N < fdnas.rounds = {train.rounds} (at least one round updates alpha)",
            ),
            target_flops=t.get("target-flops", cls.target_flops, float, *fraction),
            max_flops=t.get("max-flops", cls.max_flops, float, *fraction),
            hardware_loss=t.one_of("hardware-loss", cls.hardware_loss, ("log-gap", "add-linear")),
            hardware_beta=t.number("hardware-beta", cls.hardware_beta, lambda v: v >= 0, ">= 0"),
            hardware_lambda=t.number(
                "hardware-lambda", cls.hardware_lambda, lambda v: v >= 0, ">= 0 (0: no term)"
            ),
            derive_beta=t.number(
                "derive-beta",
                cls.derive_beta,
                lambda v: math.isfinite(v) and v >= 0,
                ">= 0 (0: the argmax, no pull toward the target)",
            ),
            num_clusters=t.get(
                "num-clusters",
                cls.num_clusters,
                int,
                positive,
                ">= 1 (used unless the partitioner is class-groups or nodes declare 'cluster')",
            ),
            cluster_rounds=t.count("cluster-rounds", cls.cluster_rounds),
            cluster_target_flops=targets,
            final=TrainingRecipe.from_config(
                cfg,
                p + "final-",
                replace(train, rounds=cls.final.rounds, lr=cls.final.lr),
                keys=("rounds", "local_epochs", "lr"),
            ),
            final_init=t.one_of("final-init", cls.final_init, ("scratch", "supernet")),
            min_replies=min_replies,
            **_latency(t),
            **cls.shared_from_config(cfg),
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


def _latency(t: Table) -> dict[str, Any]:
    """``fdnas.resource``, ``fdnas.target-ms`` and ``fdnas.cluster-target-ms``: with the
    resource latency both targets are required, in milliseconds (0 / "": unset)."""
    p = t.prefix
    resource = t.one_of("resource", FDNASSettings.resource, ("flops", "latency"))
    target = t.get("target-ms", 0.0, float, lambda v: v >= 0, "> 0 ms (0: unset)")
    targets = t.numbers(
        "cluster-target-ms",
        "",
        float,
        lambda v: math.isfinite(v) and v > 0,
        "comma-separated milliseconds > 0, one for every cluster or one per cluster "
        "(in cluster order)",
    )
    if resource == "latency":
        if target <= 0:
            raise ValueError(
                f"run config '{p}target-ms' = {target!r}: with '{p}resource' = 'latency' give "
                "the global search's latency target in milliseconds, > 0"
            )
        if t.cfg.get("method") == "cfdnas" and not targets:
            raise ValueError(
                f"run config '{p}cluster-target-ms' = '': with '{p}resource' = 'latency' give "
                'the clusters\' latency targets in milliseconds, e.g. "2.5" or "3,1.5"'
            )
        max_flops = t.get("max-flops", FDNASSettings.max_flops, float)
        if max_flops < 1:
            raise ValueError(
                f"run config '{p}max-flops' = {max_flops!r}: with '{p}resource' = 'latency' "
                "the latency targets bound the derived nets; allowed: 1.0"
            )
    return {"resource": resource, "target_ms": target, "cluster_target_ms": targets}
