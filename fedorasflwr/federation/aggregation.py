"""Aggregation of partial models: OPA (FedorAS, Eq. 5).

``opa`` generalises FedAvg to updates that carry a subset of the keys, each key
weighted by the number of samples that actually trained it.  A key moves only
when more than one update carries it with a positive count (the paper's
privacy rule); otherwise it keeps its current value.  When every update
carries every key counted by its example count, OPA is exactly FedAvg.

``Aggregation`` is the run's choice of how one key's updates are combined
(run config ``aggregation``): the count-weighted ``"mean"`` (OPA / FedAvg), or
a robust, unweighted coordinate-wise ``"median"`` or ``"trimmed-mean"``
(Flower's ``FedMedian`` / ``FedTrimmedAvg`` rules, ``aggregate_median`` and
``aggregate_trimmed_avg``), applied per key over the updates that carry the key
with a positive count.  Counts then only decide who takes part, not how much:
one client inflating its counts, or lying about its data size in its profile,
cannot pull the aggregate further than any other single client.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import ArrayRecord
from flwr.server.strategy.aggregate import aggregate_median, aggregate_trimmed_avg

from ..arrays import to_array, view_of
from ..config import AGGREGATION_RULES, check_aggregation

__all__ = ["AGGREGATIONS", "MEAN", "Aggregation", "opa", "weighted_mean"]

#: the values of run config ``aggregation``
AGGREGATIONS = AGGREGATION_RULES

Counts = Mapping[str, int] | int


def _count(counts: Counts, key: str) -> int:
    if isinstance(counts, int):
        return counts
    return int(counts.get(key, 0))


def weighted_mean(
    arrays: Sequence[np.ndarray], weights: Sequence[float], dtype: np.dtype
) -> np.ndarray:
    """Weighted mean computed in float64 and cast back to ``dtype`` (integers rounded)."""
    total = float(sum(weights))
    acc = np.zeros(arrays[0].shape, dtype=np.float64)
    for array, weight in zip(arrays, weights, strict=True):
        acc += array.astype(np.float64) * (weight / total)
    if np.issubdtype(dtype, np.integer):
        acc = np.rint(acc)
    return np.asarray(acc, dtype=dtype)  # 0-d results stay arrays


@dataclass(frozen=True)
class Aggregation:
    """How the updates of one key are combined.

    Parameters
    ----------
    rule : str (default: "mean")
        ``"mean"``: weighted by the counts; ``"median"``: coordinate-wise median;
        ``"trimmed-mean"``: coordinate-wise mean after cutting ``int(trim * n)``
        of the ``n`` values at each end (fewer than ``1 / trim`` updates: nothing
        is cut).  The robust rules ignore the counts.
    trim : float (default: 0.2)
        Fraction cut at each end by ``"trimmed-mean"``, ``0 <= trim < 0.5``.
    """

    rule: str = "mean"
    trim: float = 0.2

    def __post_init__(self) -> None:
        check_aggregation(self.rule, self.trim)

    @property
    def robust(self) -> bool:
        """Whether the counts are ignored (median, trimmed mean)."""
        return self.rule != "mean"

    def combine(
        self, arrays: Sequence[np.ndarray], weights: Sequence[float], dtype: np.dtype
    ) -> np.ndarray:
        """Combine ``arrays`` (one per update) in float64; cast back to ``dtype``
        (integers rounded).  ``weights`` are used by ``"mean"`` only."""
        if self.rule == "mean":
            return weighted_mean(arrays, weights, dtype)
        results = [([np.asarray(a, dtype=np.float64)], 1) for a in arrays]
        if self.rule == "median":
            (acc,) = aggregate_median(results)
        else:
            (acc,) = aggregate_trimmed_avg(results, self.trim)
        if np.issubdtype(dtype, np.integer):
            acc = np.rint(acc)
        return np.asarray(acc, dtype=dtype)

    @classmethod
    def of(cls, settings: Any) -> Aggregation:
        """The aggregation a method's settings name (``MethodSettings.aggregation_rule``,
        ``aggregation_trim``)."""
        return cls(settings.aggregation_rule, settings.aggregation_trim)

    def describe(self) -> str:
        """e.g. ``"trimmed-mean (trim 0.2)"``."""
        return f"{self.rule} (trim {self.trim})" if self.rule == "trimmed-mean" else self.rule


#: the default: the count-weighted mean (OPA, FedAvg)
MEAN = Aggregation()


def opa(
    current: ArrayRecord,
    updates: Sequence[tuple[ArrayRecord, Counts]],
    *,
    min_contributors: int = 2,
    aggregation: Aggregation = MEAN,
) -> ArrayRecord:
    """Operator aggregation (OPA) of partial updates.

    Parameters
    ----------
    current : ArrayRecord
        The global arrays; not modified.
    updates : sequence of (ArrayRecord, counts)
        Each update holds a subset of ``current``'s keys.  ``counts`` maps a key
        to the number of samples that trained it (missing key: 0), or is one
        int used for every key (the update's ``num-examples``: then OPA is FedAvg).
    min_contributors : int (default: 2)
        A key is updated only when at least this many updates carry it with a
        positive count (paper: "more than one client").
    aggregation : Aggregation (default: the count-weighted mean)
        How a key's contributors are combined (median / trimmed mean: unweighted,
        over the same contributors).

    Returns
    -------
    ArrayRecord
        New global arrays, same keys and order as ``current``.

    Raises
    ------
    ValueError
        If an update carries a key ``current`` lacks, or a shape that differs.
    """
    for index, (record, counts) in enumerate(updates):
        for key in record:
            if key not in current:
                raise ValueError(f"update {index} carries unknown key {key!r}")
            if tuple(record[key].shape) != tuple(current[key].shape):
                raise ValueError(
                    f"update {index} key {key!r}: shape {tuple(record[key].shape)} "
                    f"!= {tuple(current[key].shape)}"
                )
        if not isinstance(counts, int) and any(int(v) < 0 for v in counts.values()):
            raise ValueError(f"update {index} has a negative count")
        if isinstance(counts, int) and counts < 0:
            raise ValueError(f"update {index} has a negative count")

    result = ArrayRecord()
    for key, array in current.items():
        contributors = [
            (record[key], _count(counts, key))
            for record, counts in updates
            if key in record and _count(counts, key) > 0
        ]
        if len(contributors) < min_contributors:
            result[key] = array
            continue
        base = view_of(array)
        mean = aggregation.combine(
            [view_of(update) for update, _ in contributors],
            [count for _, count in contributors],
            base.dtype,
        )
        result[key] = to_array(mean)
    return result
