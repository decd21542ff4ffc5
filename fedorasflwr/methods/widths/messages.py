"""The width baselines' message types (docs/protocol.md), both sides."""

__all__ = ["WIDTHS_EVALUATE", "WIDTHS_TRAIN"]

WIDTHS_TRAIN = "train.widths"  # HeteroFL / FjORD: train the tier-width slice, reply with it
WIDTHS_EVALUATE = "evaluate.widths"  # a tier's model on the node's test split
