"""FDNAS and CFDNAS's message types (``<category>.<action>``; the table of docs/protocol.md),
imported by its strategy and its client alike; the record keys every method shares are in
``fedorasflwr.protocol``."""

from __future__ import annotations

__all__ = ["FDNAS_SEARCH", "FDNAS_TRAIN", "FDNAS_EVALUATE"]

FDNAS_SEARCH = "train.fdnas_search"
FDNAS_TRAIN = "train.fdnas_final"
FDNAS_EVALUATE = "evaluate.fdnas_final"
