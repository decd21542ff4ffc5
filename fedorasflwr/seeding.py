"""Named random streams: every seeded generator of the project, server and client side.

A stream is fixed by the run's ``seed``, a *purpose* (a name such as ``"tiers"`` or
``"fedoras-train"``) and keys (round, partition id, tier, ...)::

    rng = numpy_stream(seed, "client-split", partition_id)
    loader = seeded_loader(dataset, 32, stream_words(seed, "fedoras-train", round, pid))

Streams are derived afresh from these words, never advanced across rounds, so two
purposes never share draws, a resumed run needs no saved generator state, and a client
derives the same stream in any process.  Purposes are hashed with :func:`stable_hash`
(``hash()`` is salted per process).  DP noise does not come from here: it comes from the
OS (``methods/dpfnas/secure_random.py``), so that the server cannot regenerate it.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = [
    "numpy_generator",
    "numpy_stream",
    "seed_torch",
    "stable_hash",
    "stream_words",
    "substream",
    "torch_generator",
    "torch_stream",
]


def stable_hash(text: str) -> int:
    """A process-independent 32-bit FNV-1a hash of ``text`` (``hash()`` is salted)."""
    value = 2166136261
    for byte in text.encode():
        value = ((value ^ byte) * 16777619) & 0xFFFFFFFF
    return value


def stream_words(seed: int, purpose: str, *keys: int | str) -> tuple[int, ...]:
    """The words fixing a stream: ``(seed, stable_hash(purpose), *keys)`` (str keys hashed)."""
    if not isinstance(purpose, str) or not purpose:
        raise ValueError(f"a stream needs a non-empty purpose name; got {purpose!r}")
    return (
        int(seed),
        stable_hash(purpose),
        *(stable_hash(k) if isinstance(k, str) else int(k) for k in keys),
    )


def numpy_stream(seed: int, purpose: str, *keys: int | str) -> np.random.Generator:
    """A ``numpy`` generator for ``purpose`` fixed by ``seed`` and ``keys``."""
    return numpy_generator(stream_words(seed, purpose, *keys))


def numpy_generator(words: tuple[int, ...] | list[int]) -> np.random.Generator:
    """A ``numpy`` generator fixed by stream words (:func:`stream_words`)."""
    return np.random.default_rng([int(w) for w in words])


def torch_generator(words: tuple[int, ...] | list[int]) -> torch.Generator:
    """A CPU ``torch.Generator`` fixed by stream words (:func:`stream_words`)."""
    value = 0
    for word in words:
        value = (value * 1_000_003 + int(word)) % (2**63 - 1)
    return torch.Generator().manual_seed(value)


def torch_stream(seed: int, purpose: str, *keys: int | str) -> torch.Generator:
    """A CPU ``torch.Generator`` for ``purpose`` fixed by ``seed`` and ``keys``."""
    return torch_generator(stream_words(seed, purpose, *keys))


def seed_torch(seed: int, purpose: str, *keys: int | str) -> None:
    """Seed torch's global generator (what ``nn.Module`` initialisation draws from)."""
    torch.manual_seed(int(numpy_stream(seed, purpose, *keys).integers(2**31)))


def substream(words: tuple[int, ...] | list[int], purpose: str) -> tuple[int, ...]:
    """The words of a stream of its own inside another (e.g. a validation order beside a
    training order): ``words`` plus the purpose's hash."""
    return (*words, stable_hash(purpose))
