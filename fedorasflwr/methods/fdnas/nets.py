"""The derived nets of FDNAS / CFDNAS and the FedAvg stage that trains them.

``DerivedNet`` is one normal net (the most probable path, pulled toward its stage's
target: ``derivation``) with its cost, trained weights and the paper's two accuracies:
federated-averaged (the global model on the pooled test data) and local (each client's
test accuracy after its local epochs).  ``FDNASResult`` is what ``FDNAS.start`` /
``CFDNAS.start`` return.  ``LocalAccuracyFedAvg`` is the FedAvg that trains a derived net
and keeps the local accuracies of the replies it accepts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Message
from flwr.serverapp.strategy import Result

from ...costs import flops_to_macs
from ...federation.fedavg import SeededFedAvg
from ...federation.replies import check_reply
from ...latency import LatencyTable
from ...protocol import METRICS

__all__ = ["DerivedNet", "FDNASResult", "LocalAccuracyFedAvg"]


@dataclass
class DerivedNet:
    """One derived net: its architecture, cost, trained weights and accuracies.

    ``averaged_test_accuracy`` is set from ``test_accuracy`` and ``test_count``: the mean
    over partitions weighted by their test samples, i.e. the accuracy on the pooled test
    data of its partitions (the paper's federated-averaged accuracy). Every field is
    described in docs/fdnas.md."""

    name: str
    arch: tuple[int, ...]
    option_names: list[str]
    flops: int
    params: int
    arrays: ArrayRecord
    partitions: list[int]
    test_accuracy: dict[int, float]
    test_count: dict[int, int]
    local_accuracy: dict[int, float]
    history: list[dict[str, Any]] = field(default_factory=list)
    # fdnas.resource = "flops": its stage's target (absolute FLOPs), which pulled its derivation
    target_flops: float | None = None
    # fdnas.resource = "latency": its latency predicted by its stage's group table, and
    # that stage's target (both ms)
    latency_ms: float | None = None
    target_ms: float | None = None
    # on the server's global test set (data.global-test; set by the app's runner,
    # runs.GlobalTest): the accuracy and the set's samples
    global_test_accuracy: float | None = None
    global_test_count: int | None = None
    averaged_test_accuracy: float = field(init=False)

    def __post_init__(self) -> None:
        self.averaged_test_accuracy = self.averaged_accuracy()

    @property
    def macs(self) -> int:
        """MACs of one sample (``flops / 2``; the papers' "FLOPs")."""
        return int(flops_to_macs(self.flops))

    def averaged_accuracy(self, partitions: Iterable[int] | None = None) -> float:
        """Federated-averaged accuracy: the global model on the pooled test data of
        ``partitions`` (default: all of its own), i.e. ``test_accuracy`` weighted by
        ``test_count``; 0.0 without a test sample."""
        ids = [p for p in (self.partitions if partitions is None else partitions)]
        ids = [p for p in ids if p in self.test_count]  # evaluations that were dropped
        count = sum(self.test_count[p] for p in ids)
        return sum(self.test_accuracy[p] * self.test_count[p] for p in ids) / max(count, 1)

    def mean_local_accuracy(self, partitions: Iterable[int] | None = None) -> float:
        """Mean over clients of the test accuracy after their local epochs (paper's dagger)."""
        ids = [p for p in (self.partitions if partitions is None else partitions)]
        values = [self.local_accuracy[p] for p in ids if p in self.local_accuracy]
        return float(np.mean(values)) if values else float("nan")

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "arch": list(self.arch),
            "options": self.option_names,
            "flops": self.flops,
            "macs": self.macs,
            "params": self.params,
            "partitions": self.partitions,
            "averaged-accuracy": self.averaged_test_accuracy,
            "mean-local-accuracy": (
                None if math.isnan(local := self.mean_local_accuracy()) else local
            ),
            "test-accuracy": self.test_accuracy,
            "test-count": self.test_count,
            "local-accuracy": self.local_accuracy,
            "history": self.history,
            **(
                {}
                if self.global_test_accuracy is None
                else {
                    "global-test-accuracy": self.global_test_accuracy,
                    "global-test-count": self.global_test_count,
                }
            ),
            **(
                {}
                if self.target_flops is None
                else {
                    "target-flops": self.target_flops,
                    "target-macs": flops_to_macs(self.target_flops),
                }
            ),
            **(
                {}
                if self.latency_ms is None
                else {"predicted-ms": self.latency_ms, "target-ms": self.target_ms}
            ),
        }


@dataclass(kw_only=True, repr=False)
class FDNASResult(Result):
    """What ``FDNAS.start`` / ``CFDNAS.start`` return: Flower's ``Result`` (``arrays``:
    the searched supernet, as ``supernet``; per global search round the aggregated
    training metrics and ``evaluate_fn``'s), the derived nets, clusters and histories.
    Every field is described in docs/fdnas.md."""

    supernet: ArrayRecord = field(default_factory=ArrayRecord)
    nets: list[DerivedNet] = field(default_factory=list)
    cluster_of_partition: dict[int, int] = field(default_factory=dict)
    search_history: list[dict[str, Any]] = field(default_factory=list)
    cluster_history: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    ledger: dict[str, Any] = field(default_factory=dict)
    # fdnas.resource = "latency": every node's table (node id ->) and each stage's group table
    latency_tables: dict[int, LatencyTable] = field(default_factory=dict)
    group_tables: dict[str, LatencyTable] = field(default_factory=dict)


class LocalAccuracyFedAvg(SeededFedAvg):
    """``SeededFedAvg`` that also keeps each client's last ``local-accuracy``."""

    def __init__(self, *, partition_of: dict[int, int], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.partition_of = partition_of
        self.local_accuracy: dict[int, float] = {}

    def _usable(self, replies: Iterable[Message], with_arrays: bool) -> list[Message]:
        """Record ``local-accuracy`` of the training replies FedAvg accepts, and only those."""
        usable = super()._usable(replies, with_arrays)
        for reply in usable if with_arrays else ():
            if check_reply(reply, counts=("local-accuracy",)) is None:
                value = float(reply.content.metric_records[METRICS]["local-accuracy"])
                self.local_accuracy[self.partition_of[reply.metadata.src_node_id]] = value
        return usable
