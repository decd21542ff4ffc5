"""Checks of a cached partition, server slice or global test set: is it the data the spec
describes?

A cache file is trusted only if (1) its checksum - SHA-256 over every tensor's
dtype, shape and bytes and every other value - matches (a flipped bit on disk,
a truncated copy), and (2) its content is in range for the dataset (a file
written by a buggy or foreign builder with a valid checksum): every split
present as an ``[x, y]`` pair of equal length; images float32
``(N, *input_shape)`` with finite values and int64 labels ``(N,)`` in
``[0, num_classes)``; text int64 ``(N, seq_len)`` ids in ``[0, vocab size)``
for inputs and targets; the class count and the label histogram consistent.
Each check returns what is wrong, or ``None``; the loader rebuilds a bad file.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from .catalog import DatasetInfo

__all__ = [
    "CLIENT_SPLITS",
    "checksum",
    "client_problem",
    "global_test_problem",
    "server_problem",
]

CLIENT_SPLITS = ("train", "val", "test")


def checksum(payload: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of ``payload``: keys in sorted order, tensors by dtype, shape and bytes."""
    digest = hashlib.sha256()
    for key in sorted(payload):
        digest.update(f"key:{key};".encode())
        _feed(digest, payload[key])
    return digest.hexdigest()


def _feed(digest: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        array = np.ascontiguousarray(value.detach().cpu().numpy())
        digest.update(f"tensor:{value.dtype}:{tuple(value.shape)};".encode())
        digest.update(array.view(np.uint8).reshape(-1).data)
    elif isinstance(value, list | tuple):
        digest.update(f"list:{len(value)};".encode())
        for item in value:
            _feed(digest, item)
    else:
        digest.update(f"{type(value).__name__}:{value!r};".encode())


def client_problem(payload: Mapping[str, Any], info: DatasetInfo) -> str | None:
    """What is wrong with a client payload for dataset ``info`` (``None``: nothing)."""
    for name in CLIENT_SPLITS:
        problem = _split_problem(name, payload.get(name), info)
        if problem is not None:
            return problem
    if payload.get("num-classes") != info.num_classes:
        return f"num-classes is {payload.get('num-classes')!r}, the dataset has {info.num_classes}"
    targets = payload["train"][1].reshape(-1)
    expected = torch.bincount(targets, minlength=info.num_classes).tolist()
    if list(payload.get("label-counts", ())) != expected:
        return "label-counts do not match the training labels"
    return None


def server_problem(payload: Mapping[str, Any], info: DatasetInfo) -> str | None:
    """What is wrong with a server-slice payload for dataset ``info`` (``None``: nothing)."""
    return _split_problem("server", payload.get("server"), info)


def global_test_problem(payload: Mapping[str, Any], info: DatasetInfo) -> str | None:
    """What is wrong with a global-test payload for dataset ``info`` (``None``: nothing)."""
    return _split_problem("global-test", payload.get("global-test"), info)


def _split_problem(name: str, pair: Any, info: DatasetInfo) -> str | None:
    if pair is None:
        return f"split {name!r} is missing"
    if not (
        isinstance(pair, list | tuple)
        and len(pair) == 2
        and all(isinstance(t, torch.Tensor) for t in pair)
    ):
        return f"split {name!r} is not an [inputs, labels] pair of tensors"
    inputs, labels = pair
    if len(inputs) != len(labels):
        return f"split {name!r} has {len(inputs)} inputs but {len(labels)} labels"
    count = len(inputs)
    if info.kind == "text":
        shapes = {"inputs": (count, *info.input_shape), "labels": (count, *info.input_shape)}
        dtypes = {"inputs": torch.int64, "labels": torch.int64}
    else:
        shapes = {"inputs": (count, *info.input_shape), "labels": (count,)}
        dtypes = {"inputs": torch.float32, "labels": torch.int64}
    for part, tensor in (("inputs", inputs), ("labels", labels)):
        shape = tuple(tensor.shape)
        if shape != shapes[part]:
            return f"split {name!r} {part} have shape {shape}, expected {shapes[part]}"
        if tensor.dtype != dtypes[part]:
            return f"split {name!r} {part} are {tensor.dtype}, expected {dtypes[part]}"
    if info.kind != "text" and not bool(torch.isfinite(inputs).all()):
        return f"split {name!r} has non-finite input values"
    ids = [("labels", labels)] + ([("inputs", inputs)] if info.kind == "text" else [])
    for part, tensor in ids:
        if count and (int(tensor.min()) < 0 or int(tensor.max()) >= info.num_classes):
            return (
                f"split {name!r} {part} range over [{int(tensor.min())}, {int(tensor.max())}],"
                f" outside the dataset's classes 0..{info.num_classes - 1}"
            )
    return None
