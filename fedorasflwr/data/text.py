"""Character vocabulary and next-character windows, shared by every text dataset.

Vocabulary: ``string.printable`` without ``"\\r"``, ``"\\x0b"`` and ``"\\x0c"`` - 97
characters (digits, letters, punctuation, space, tab, newline) with ids 0..96 in
that order - plus one out-of-vocabulary id, 97, for anything else (e.g. the few
curly quotes and dashes in ``pydoc_data.topics``). 98 ids in all, identical for
every client and dataset.

Windows: a text of ``n`` characters is cut into inputs ``x = text[p : p + L]`` and
targets ``y = text[p + 1 : p + L + 1]`` (``L = seq_len``, the next character at
every position) at starts ``p = 0, L, 2L, ...``: the inputs do not overlap. If
characters are left over, one more window is aligned to the end of the text
(it overlaps its predecessor by fewer than ``L`` characters), so that no text is
wasted and short texts (the shortest pydoc topic has 202 characters) still give
``ceil((n - 1) / L)`` windows. Texts shorter than ``L + 1`` give none.
"""

from __future__ import annotations

import string

import numpy as np

__all__ = ["VOCAB", "OOV_ID", "encode", "decode", "num_windows", "windows"]

VOCAB = "".join(c for c in string.printable if c not in "\r\x0b\x0c")
OOV_ID = len(VOCAB)

_TABLE = np.full(128, OOV_ID, dtype=np.int64)
_TABLE[[ord(c) for c in VOCAB]] = np.arange(len(VOCAB))
_TABLE.flags.writeable = False


def encode(text: str) -> np.ndarray:
    """Character ids (int64) of ``text``; characters outside :data:`VOCAB` map to ``OOV_ID``."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
    return np.where(codes < 128, _TABLE[np.minimum(codes, 127)], OOV_ID)


def decode(ids: np.ndarray) -> str:
    """Inverse of :func:`encode` (OOV ids become ``"\\ufffd"``)."""
    return "".join(VOCAB[i] if i < OOV_ID else "\ufffd" for i in np.asarray(ids).tolist())


def _starts(length: int, seq_len: int) -> np.ndarray:
    if length < seq_len + 1:
        return np.zeros(0, dtype=np.int64)
    starts = np.arange(0, length - seq_len, seq_len, dtype=np.int64)
    if starts[-1] != length - 1 - seq_len:
        starts = np.append(starts, length - 1 - seq_len)
    return starts


def num_windows(length: int, seq_len: int) -> int:
    """Windows :func:`windows` cuts from a text of ``length`` characters."""
    return len(_starts(length, seq_len))


def windows(ids: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and next-character targets, each ``(num_windows, seq_len)`` int64."""
    starts = _starts(len(ids), seq_len)
    offsets = starts[:, None] + np.arange(seq_len)[None, :]
    return ids[offsets], ids[offsets + 1]
