"""FedorAS's message types (``<category>.<action>``; the table of docs/protocol.md),
imported by its strategy and its client alike; the record keys every method shares are in
``fedorasflwr.protocol``."""

from __future__ import annotations

__all__ = ["FEDORAS_SUPERNET", "FEDORAS_PATHS", "FEDORAS_TRAIN", "FEDORAS_EVALUATE"]

FEDORAS_SUPERNET = "train.fedoras_supernet"
FEDORAS_PATHS = "evaluate.fedoras_paths"
FEDORAS_TRAIN = "train.fedoras_finetune"
FEDORAS_EVALUATE = "evaluate.fedoras_finetune"
