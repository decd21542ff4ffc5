"""Aggregation of partial models: OPA (FedorAS, Eq. 5).

``opa`` generalises FedAvg to updates that carry a subset of the keys, each key
weighted by the number of samples that actually trained it.  A key moves only
when more than one update carries it with a positive count (the paper's
privacy rule); otherwise it keeps its current value.  When every update
carries every key counted by its example count, OPA is exactly FedAvg.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from flwr.app import Array, ArrayRecord

__all__ = ["opa", "weighted_mean"]

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


def opa(
    current: ArrayRecord,
    updates: Sequence[tuple[ArrayRecord, Counts]],
    *,
    min_contributors: int = 2,
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
        base = array.numpy()
        mean = weighted_mean(
            [update.numpy() for update, _ in contributors],
            [count for _, count in contributors],
            base.dtype,
        )
        result[key] = Array(mean)
    return result
