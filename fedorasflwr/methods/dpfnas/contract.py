"""What the DP-FNAS server and its parties agree on: the message types and the keys.

The server needs these to build messages and to account for privacy, the parties to
read the messages and to run the mechanisms; both import them from here, so the
server imports nothing of the client side.  The record keys every method shares are in
``fedorasflwr.protocol``.
"""

from __future__ import annotations

__all__ = [
    "DPFNAS_ARCH",
    "DPFNAS_EVALUATE",
    "DPFNAS_TRAIN",
    "DPFNAS_WEIGHTS",
    "INSECURE_KEY",
    "PREVIOUS_PREFIX",
    "final_steps",
]

# the message types (``<category>.<action>``; the table of docs/protocol.md)
DPFNAS_WEIGHTS = "train.dpfnas_weights"  # a W step: clipped, noised weight gradients
DPFNAS_ARCH = "train.dpfnas_arch"  # an A step: clipped, noised architecture gradients
DPFNAS_TRAIN = "train.dpfnas_final"  # FedAvg (or DP-SGD) of the derived network
DPFNAS_EVALUATE = "evaluate.dpfnas_final"

PREVIOUS_PREFIX = "previous."
"""Second order only: the weights W before the last W step travel under this prefix."""

INSECURE_KEY = "insecure-reproducible-noise"
"""Message-config key (run config ``dpfnas.insecure-reproducible-noise``): seeded DP noise."""


def final_steps(num_train: int, batch_size: int, local_epochs: int) -> int:
    """DP-SGD steps of one round of private final training (ceil(N / B) per epoch)."""
    return local_epochs * -(-num_train // batch_size)
