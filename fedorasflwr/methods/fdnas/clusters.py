"""CFDNAS's clusters: which client goes to which cluster (checked in ``cfdnas.py``).

The paper (Zhang et al., arXiv:2011.03372, Algorithm 2) splits the clients "into clusters
by users' tag": each client sends the server a tag about its data or device, and its
experiments group clients 0-2 (GPU) and 3-5 (CPU).  Here a node's tag is, in order:

1. the ``cluster`` its node config declares (the paper's tag);
2. else the strategy's ``cluster_of(profile)``, when one is given;
3. else ``contiguous_cluster``: ``num_clusters`` contiguous ranges of partition ids, as
   near-equal as they go with the remainder in the last ranges (10 partitions, 3 clusters:
   0-2, 3-5, 6-9, the paper's layout).  It reads only the partition id and the number of
   partitions, so the same run config gives the same clusters whatever the Flower node
   ids, the order in which nodes connect, or the seed.  Where the number of partitions is
   unknown (``num-partitions = 0``: ids derived from the data), the ranges are of the
   profiled ids in sorted order (``rank_bounds``).

The project's runner uses the same function for the ``class-groups`` partitioner (one
cluster per class group).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from ...data.groups import even_sizes

__all__ = [
    "bounded_cluster",
    "cluster_ranges",
    "contiguous_cluster",
    "describe_clusters",
    "rank_bounds",
]


def cluster_ranges(num_partitions: int, num_clusters: int) -> list[range]:
    """The partition ids of each of ``num_clusters`` contiguous ranges of
    ``0..num_partitions - 1`` (near-equal, the remainder in the last); a range is empty
    when there are fewer partitions than clusters."""
    if num_clusters < 1:
        raise ValueError(f"num_clusters = {num_clusters}: allowed: an integer >= 1")
    ends = np.cumsum(even_sizes(num_partitions, num_clusters)).tolist()
    return [range(start, end) for start, end in zip([0, *ends[:-1]], ends, strict=True)]


def contiguous_cluster(partition_id: int, num_partitions: int, num_clusters: int) -> int:
    """The cluster (0-based) of ``partition_id`` among ``num_clusters`` contiguous ranges of
    ``num_partitions`` partition ids (``cluster_ranges``)."""
    if not 0 <= partition_id < num_partitions:
        raise ValueError(
            f"partition-id = {partition_id} is outside 0..{num_partitions - 1} "
            f"(num-partitions = {num_partitions}): each node's partition-id must be below "
            "its num-partitions"
        )
    for tag, members in enumerate(cluster_ranges(num_partitions, num_clusters)):
        if partition_id in members:
            return tag
    raise AssertionError("unreachable: the ranges cover 0..num_partitions - 1")


def rank_bounds(partition_ids: Iterable[int], num_clusters: int) -> list[float]:
    """Where clusters 1..``num_clusters - 1`` start when the number of partitions is unknown
    (``num-partitions = 0``, partition ids derived from the data): the sorted ``partition_ids``
    split into ``cluster_ranges`` by rank, each cluster starting at its first id (with fewer
    ids than clusters the first clusters are empty; with none, every start is ``inf``).
    ``bounded_cluster`` gives an id's cluster, also for an id that arrives later."""
    ids = sorted(set(partition_ids))
    ranges = cluster_ranges(len(ids), num_clusters)
    return [ids[r.start] if r.start < len(ids) else math.inf for r in ranges[1:]]


def bounded_cluster(partition_id: int, bounds: Sequence[float]) -> int:
    """The cluster of ``partition_id`` under ``rank_bounds``: the last one starting at or
    below it."""
    return bisect.bisect_right(list(bounds), partition_id)


def describe_clusters(cluster_of_partition: Mapping[int, int]) -> str:
    """``"0: [0, 1, 2]; 1: [3, 4, 5]"``: each cluster's partition ids, in tag order."""
    tags = sorted(set(cluster_of_partition.values()))
    return "; ".join(
        f"{tag}: {sorted(p for p, t in cluster_of_partition.items() if t == tag)}" for tag in tags
    )
