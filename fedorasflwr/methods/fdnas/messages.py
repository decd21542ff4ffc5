"""FDNAS's and CFDNAS's message types (docs/protocol.md): the search, the final training."""

__all__ = ["FDNAS_SEARCH", "FDNAS_TRAIN", "FDNAS_EVALUATE"]

FDNAS_SEARCH = "train.fdnas_search"
FDNAS_TRAIN = "train.fdnas_final"
FDNAS_EVALUATE = "evaluate.fdnas_final"
