"""DecNAS client groups (§4.2): balanced data sizes, representative label histograms.

Clients share only their training-label histogram and data size.  A partition
``{G_1, ..., G_K}`` should minimise the mean L1 distance between each group's
normalised label histogram and the global one, subject to
``max(d_j) <= r * min(d_j)`` for the groups' data sizes ``d_j``.  The paper's
greedy: sort clients by data size, largest first; give each to the group that
keeps the balance and gives the smallest mean distance.  Here a group may take
a client when it is (one of) the smallest, or when it stays within ``r`` times
the smallest after taking it; among those, the one whose distance to the global
histogram improves most wins (ties: the smaller group, then the lower index).

Candidates are then scheduled onto groups (:func:`schedule_waves`): each to a
free group in a seeded random order, and when there are more candidates than
groups, the rest wait for the next wave (the paper's queue).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = [
    "PLAUSIBLE_FACTOR",
    "balance_ratio",
    "clip_declared",
    "group_clients",
    "label_distribution",
    "mean_label_distance",
    "random_groups",
    "schedule_waves",
]


def label_distribution(counts: Sequence[float] | np.ndarray) -> np.ndarray:
    """Counts per class -> fractions per class (all zeros for an empty histogram)."""
    values = np.asarray(counts, dtype=np.float64)
    total = values.sum()
    return values / total if total > 0 else np.zeros_like(values)


def _distance(counts: np.ndarray, target: np.ndarray) -> float:
    if counts.sum() <= 0:
        return 2.0  # an empty group is as far as two distributions can be
    return float(np.abs(label_distribution(counts) - target).sum())


#: a node declaring more training samples than this many times the median of the
#: profiled nodes' counts weighs in the grouping as that bound (``clip_declared``)
PLAUSIBLE_FACTOR = 4.0


def clip_declared(
    sizes: Sequence[int], label_counts: Sequence[Sequence[int]], factor: float = PLAUSIBLE_FACTOR
) -> tuple[list[int], list[list[int]], list[int]]:
    """Sizes and label histograms as the grouping uses them: a size above ``factor`` x the
    median size is cut to that bound and its histogram scaled down with it (rounded), so a
    node that declares an implausible size (its counts adding up) moves the groups of the
    others no more than a node of ``factor`` x the median would. Returns the sizes, the
    histograms and the indices of the clients cut."""
    if not sizes:
        return [], [], []
    limit = max(1, math.floor(factor * float(np.median(sizes))))
    out_sizes, out_counts, cut = [], [], []
    for index, (size, counts) in enumerate(zip(sizes, label_counts, strict=True)):
        if size > limit:
            cut.append(index)
            scale = limit / size
            out_sizes.append(limit)
            out_counts.append([round(c * scale) for c in counts])
        else:
            out_sizes.append(int(size))
            out_counts.append([int(c) for c in counts])
    return out_sizes, out_counts, cut


def group_clients(
    sizes: Sequence[int],
    label_counts: Sequence[Sequence[int]],
    num_groups: int,
    balance: float,
) -> list[list[int]]:
    """Partition clients ``0..n-1`` into ``min(num_groups, n)`` groups (greedy, §4.2).

    Parameters
    ----------
    sizes : sequence of int
        Each client's data number (training samples).
    label_counts : sequence of sequences of int
        Each client's label histogram (same length for all).
    num_groups : int
        K, the number of groups (paper: 15-20).
    balance : float
        r >= 1: tolerated ratio of the largest to the smallest group's data size
        (paper: 1.1).  The greedy keeps it whenever a small-enough client is
        left; very uneven clients can make it unreachable.

    Returns
    -------
    list of lists of int
        Client indices per group, each sorted; deterministic.
    """
    if len(sizes) != len(label_counts):
        raise ValueError(f"{len(sizes)} sizes for {len(label_counts)} label histograms")
    if num_groups < 1 or balance < 1:
        raise ValueError(f"need num_groups >= 1 and balance >= 1, got {num_groups}, {balance}")
    counts = np.asarray(label_counts, dtype=np.float64).reshape(len(sizes), -1)
    target = label_distribution(counts.sum(axis=0))
    groups_n = min(num_groups, len(sizes))
    data = np.zeros(groups_n)
    histograms = np.zeros((groups_n, counts.shape[1]))
    members: list[list[int]] = [[] for _ in range(groups_n)]
    for client in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        smallest = data.min()
        allowed = [
            g
            for g in range(groups_n)
            if data[g] == smallest or data[g] + sizes[client] <= balance * smallest
        ]

        gains = [
            (
                _distance(histograms[g] + counts[client], target)
                - _distance(histograms[g], target),
                data[g],
                g,
            )
            for g in allowed
        ]
        best = min(gains)[2]
        members[best].append(client)
        data[best] += sizes[client]
        histograms[best] += counts[client]
    return [sorted(group) for group in members]


def random_groups(rng: np.random.Generator, num_clients: int, num_groups: int) -> list[list[int]]:
    """The baseline: a seeded random partition into groups of (nearly) equal client counts."""
    order = rng.permutation(num_clients)
    return [sorted(int(c) for c in order[g::num_groups]) for g in range(num_groups)]


def mean_label_distance(
    groups: Sequence[Sequence[int]], label_counts: Sequence[Sequence[int]]
) -> float:
    """Mean over groups of the L1 distance between its label distribution and the global one."""
    counts = np.asarray(label_counts, dtype=np.float64).reshape(len(label_counts), -1)
    target = label_distribution(counts.sum(axis=0))
    return float(np.mean([_distance(counts[list(g)].sum(axis=0), target) for g in groups]))


def balance_ratio(groups: Sequence[Sequence[int]], sizes: Sequence[int]) -> float:
    """Largest over smallest group data size (``inf`` if a group has no data)."""
    totals = [sum(sizes[c] for c in group) for group in groups]
    return max(totals) / min(totals) if min(totals) > 0 else float("inf")


def schedule_waves(
    candidates: Sequence[int], group_order: Sequence[int]
) -> list[list[tuple[int, int]]]:
    """``(candidate, group)`` pairs in waves: each wave gives every group at most one
    candidate, in ``group_order``; candidates beyond the number of groups queue."""
    width = len(group_order)
    if width == 0:
        raise ValueError("no group to schedule candidates on")
    return [
        [(c, group_order[i]) for i, c in enumerate(candidates[start : start + width])]
        for start in range(0, len(candidates), width)
    ]
