"""DP-FNAS's message types (``<category>.<action>``; the table of docs/protocol.md),
imported by its strategy and its client alike; the record keys every method shares are in
``fedorasflwr.protocol``."""

from __future__ import annotations

__all__ = ["DPFNAS_WEIGHTS", "DPFNAS_ARCH", "DPFNAS_TRAIN", "DPFNAS_EVALUATE"]

DPFNAS_WEIGHTS = "train.dpfnas_weights"
DPFNAS_ARCH = "train.dpfnas_arch"
DPFNAS_TRAIN = "train.dpfnas_final"
DPFNAS_EVALUATE = "evaluate.dpfnas_final"
