"""DecNAS's settings: the ``decnas.*`` run-config keys, read and checked."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ...config import MethodSettings, Table, TrainingRecipe, unit_interval
from ...search_spaces.prunable_nets import CONVNET_HEADS
from .netadapt import rounds_for

__all__ = ["DecNASSettings"]

VARIANTS = ("decnas", "naive", "no-groups", "no-drop", "no-dynamic-rounds", "centralised")


@dataclass(frozen=True)
class DecNASSettings(MethodSettings):
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

    TABLE: ClassVar[str] = "decnas."

    model: str = "convnet"
    head: str = CONVNET_HEADS[0]
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

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.head not in CONVNET_HEADS:
            raise ValueError(
                f"DecNASSettings.head = {self.head!r}: allowed: {', '.join(CONVNET_HEADS)}"
            )
        if self.head != CONVNET_HEADS[0] and self.model != "convnet":
            raise ValueError(
                f"run config 'decnas.head' = {self.head!r}: allowed only with 'decnas.model' "
                f"= 'convnet' (the MobileNet reads its map by global average pooling), got "
                f"{self.model!r}"
            )

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

    def iteration_rounds(self, iteration: int) -> int:
        """Short-term fine-tuning rounds of NetAdapt ``iteration`` (1-based): the schedule's
        (``rounds`` / ``rounds-every``) with dynamic rounds, else its largest."""
        if self.dynamic_rounds:
            return rounds_for(iteration, self.rounds, self.rounds_every)
        return max(self.rounds)

    def rounds_trained(self, iteration: int) -> int:
        """FedAvg rounds GM_``iteration`` has been trained, all told, before any final
        tuning: GM_0's (``gm0-rounds``) and every iteration's up to it, each GM_t starting
        from GM_t-1's weights. Short schedules give later GMs more training, so a frontier
        of short-term accuracies need not fall with the cost (quick-decnas: 5, 6, 7, 9)."""
        return self.train.rounds + sum(self.iteration_rounds(t) for t in range(1, iteration + 1))

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> DecNASSettings:
        p = "decnas."
        t = Table(cfg, p)

        number, count = t.number, t.count

        rounds = t.numbers(
            "rounds",
            ",".join(map(str, cls.rounds)),
            int,
            lambda v: v >= 1,
            "comma-separated round numbers >= 1, one per block of 'rounds-every' iterations, "
            'e.g. "2,5,8,10"',
            required=True,
        )
        return cls(
            model=t.one_of("model", cls.model, ("convnet", "mobilenet")),
            head=t.one_of("head", cls.head, CONVNET_HEADS),
            variant=t.one_of("variant", cls.variant, VARIANTS),
            resource=t.one_of("resource", cls.resource, ("macs", "params", "latency")),
            target=number("target", cls.target, lambda v: 0 < v < 1, "fraction of GM_0, 0 < t < 1"),
            initial_reduction=number(
                "initial-reduction", cls.initial_reduction, lambda v: 0 < v < 1, "0 < r < 1"
            ),
            decay=number("decay", cls.decay, lambda v: 0 < v <= 1, "0 < decay <= 1"),
            max_iterations=count("max-iterations", cls.max_iterations),
            num_groups=count("num-groups", cls.num_groups),
            balance_ratio=number("balance-ratio", cls.balance_ratio, lambda v: v >= 1, ">= 1"),
            drop_ratio=number("drop-ratio", cls.drop_ratio, unit_interval, "0 <= alpha <= 1"),
            rounds=rounds,
            rounds_every=count("rounds-every", cls.rounds_every),
            train=TrainingRecipe.from_config(
                cfg, p, cls.train, names={"rounds": "gm0-rounds"}, all_clients=True
            ),
            min_filters=count("min-filters", cls.min_filters),
            final_rounds=count("final-rounds", cls.final_rounds, 0),
            final_models=t.one_of("final-models", cls.final_models, ("last", "all")),
            pick=t.one_of("pick", cls.pick, ("degradation", "accuracy")),
            width_baseline=t.get("width-baseline", cls.width_baseline, bool),
            min_replies=count("min-replies", cls.min_replies),
            latency_devices=_latency_devices(t),
            latency_grid=t.get(
                "latency-grid", cls.latency_grid, int, lambda v: 1 <= v <= 64, "1..64"
            ),
            **cls.shared_from_config(cfg),
        )


def _latency_devices(t: Table) -> str:
    """``decnas.latency-devices``: a device-class name (letters, digits, ``._-``) or "",
    meaningful with ``decnas.resource = "latency"`` only."""
    p = t.prefix
    key = p + "latency-devices"
    name = t.get(
        "latency-devices",
        "",
        str,
        lambda v: all(c.isalnum() or c in "._-" for c in v),
        'a node config device-class name (letters, digits, "._-") or "" (every node)',
    )
    resource = t.cfg.get(p + "resource", DecNASSettings.resource)
    if name and resource != "latency":
        raise ValueError(
            f"run config '{key}' = {name!r}: allowed with '{p}resource' = \"latency\" only "
            f"(it is {resource!r})"
        )
    return name
