"""FedNAS's message types (``<category>.<action>``; the table of docs/protocol.md)."""

from __future__ import annotations

__all__ = ["FEDNAS_EVALUATE", "FEDNAS_SEARCH", "FEDNAS_TRAIN"]

FEDNAS_SEARCH = "train.fednas_search"  # local DARTS epochs: weights and alphas back
FEDNAS_TRAIN = "train.fednas_final"  # FedAvg of the derived network
FEDNAS_EVALUATE = "evaluate.fednas_final"  # the derived network on the test split
