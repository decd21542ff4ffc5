"""Costs of what travels and what is computed.

FLOPs follow ``torch.utils.flop_counter`` (FLOPs = 2 x MACs, matmuls and
convolutions only); the per-option tables live on each ``SearchSpace``.  The papers'
"FLOPs" are MACs (multiply-accumulates), so every cost a run reports is given in both
units: ``flops_to_macs`` / ``macs_to_flops`` convert, ``COST_CONVENTION`` says so in
``result.json`` and ``describe_flops`` writes both in a log line.
Bytes are those of the serialized arrays actually put into a message.
"""

from __future__ import annotations

from flwr.app import ArrayRecord

__all__ = [
    "COST_CONVENTION",
    "FLOPS_PER_MAC",
    "TRAIN_FLOPS_FACTOR",
    "array_record_bytes",
    "array_record_elements",
    "describe_flops",
    "flops_to_macs",
    "macs_to_flops",
    "training_flops",
]

#: Forward + backward of one sample costs about three forward passes.
TRAIN_FLOPS_FACTOR = 3
#: ``torch.utils.flop_counter`` counts a multiply-accumulate as two FLOPs
FLOPS_PER_MAC = 2
#: how ``result.json`` states its cost units (every ``flops`` key has ``macs`` beside it)
COST_CONVENTION = (
    "flops: FLOPs of one sample = 2 x MACs (torch.utils.flop_counter); macs: MACs = FLOPs / 2, "
    "the unit the papers call FLOPs"
)


def flops_to_macs(flops: float) -> float:
    """MACs of a cost of ``flops`` FLOPs (``flops / 2``; an ``int`` stays an ``int``).

    >>> flops_to_macs(1_346_000), flops_to_macs(2.5e6)
    (673000, 1250000.0)
    """
    if isinstance(flops, int):
        return flops // FLOPS_PER_MAC
    return flops / FLOPS_PER_MAC


def macs_to_flops(macs: float) -> float:
    """FLOPs of a cost of ``macs`` MACs (``2 x macs``, of the same type)."""
    return FLOPS_PER_MAC * macs


def describe_flops(flops: float) -> str:
    """``flops`` for a log line, in millions of both units.

    >>> describe_flops(1_346_000)
    '1.346 MFLOPs (0.673 MMACs)'
    """
    return f"{flops / 1e6:.4g} MFLOPs ({flops_to_macs(flops) / 1e6:.4g} MMACs)"


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
