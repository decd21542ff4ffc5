"""Costs of what travels and what is computed.

FLOPs follow ``torch.utils.flop_counter`` (FLOPs = 2 x MACs, matmuls and
convolutions only); the per-option tables live on each ``SearchSpace``.
Bytes are those of the serialized arrays actually put into a message.
"""

from __future__ import annotations

from flwr.app import ArrayRecord

__all__ = ["TRAIN_FLOPS_FACTOR", "array_record_bytes", "array_record_elements", "training_flops"]

#: Forward + backward of one sample costs about three forward passes.
TRAIN_FLOPS_FACTOR = 3


def array_record_bytes(record: ArrayRecord) -> int:
    """Bytes of the serialized arrays in ``record`` (what goes on the wire, headers included)."""
    return sum(len(array.data) for array in record.values())


def array_record_elements(record: ArrayRecord) -> int:
    """Number of tensor elements in ``record``."""
    total = 0
    for array in record.values():
        count = 1
        for dim in array.shape:
            count *= dim
        total += count
    return total


def training_flops(forward_flops: int, num_samples: int) -> int:
    """Training FLOPs of ``num_samples`` samples through a path of ``forward_flops`` FLOPs each."""
    return TRAIN_FLOPS_FACTOR * forward_flops * num_samples
