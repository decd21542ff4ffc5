"""FedorAS's message types: Stage 1 (supernet), Stage 2 (paths), Stage 3 (fine-tuning).

Imported by the strategy and the client alike (the table of docs/protocol.md).
"""

__all__ = ["FEDORAS_SUPERNET", "FEDORAS_PATHS", "FEDORAS_TRAIN", "FEDORAS_EVALUATE"]

FEDORAS_SUPERNET = "train.fedoras_supernet"
FEDORAS_PATHS = "evaluate.fedoras_paths"
FEDORAS_TRAIN = "train.fedoras_finetune"
FEDORAS_EVALUATE = "evaluate.fedoras_finetune"
