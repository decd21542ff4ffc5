"""What the DP-FNAS server and its parties agree on besides the message types.

The server needs these to build messages and to account for privacy, the parties to
read the messages and to run the mechanisms; both import them from here, so the
server imports nothing of the client side.
"""

from __future__ import annotations

__all__ = ["INSECURE_KEY", "PREVIOUS_PREFIX", "final_steps"]

PREVIOUS_PREFIX = "previous."
"""Second order only: the weights W before the last W step travel under this prefix."""

INSECURE_KEY = "insecure-reproducible-noise"
"""Message-config key (run config ``dpfnas.insecure-reproducible-noise``): seeded DP noise."""


def final_steps(num_train: int, batch_size: int, local_epochs: int) -> int:
    """DP-SGD steps of one round of private final training (ceil(N / B) per epoch)."""
    return local_epochs * -(-num_train // batch_size)
