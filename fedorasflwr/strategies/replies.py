"""Checks on client replies, shared by every strategy.

A reply is accepted only if it carries what was asked: an ``ArrayRecord``
whose keys are a subset of what was sent, with the same shapes and dtypes and
finite values, and a ``MetricRecord`` whose required counts are non-negative
and whose values are finite.  ``check_reply`` returns the reason a reply is
rejected, or ``None``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord

from ..protocol import ARRAYS, METRICS

__all__ = ["ArraySpec", "array_specs", "check_reply", "error_reason"]


@dataclass(frozen=True)
class ArraySpec:
    """Shape and dtype of one array that was sent."""

    shape: tuple[int, ...]
    dtype: str


def array_specs(record: ArrayRecord) -> dict[str, ArraySpec]:
    """The ``ArraySpec`` of every key in ``record``."""
    return {key: ArraySpec(tuple(a.shape), str(a.dtype)) for key, a in record.items()}


def error_reason(message: Message) -> str:
    """Why a failed reply failed (Flower's error code and reason)."""
    return f"error code {message.error.code}: {message.error.reason}"


def _check_metrics(metrics: MetricRecord, counts: Iterable[str]) -> str | None:
    for name, value in metrics.items():
        values = value if isinstance(value, list) else [value]
        if not all(math.isfinite(v) for v in values):
            return f"metric {name!r} is not finite"
    for name in counts:
        if name not in metrics:
            return f"metric {name!r} missing"
        value = metrics[name]
        values = value if isinstance(value, list) else [value]
        if any(v < 0 for v in values):
            return f"metric {name!r} is negative"
    return None


def _check_arrays(arrays: ArrayRecord, sent: Mapping[str, ArraySpec], required: bool) -> str | None:
    if required and not arrays:
        return "no arrays returned"
    unknown = [key for key in arrays if key not in sent]
    if unknown:
        return f"{len(unknown)} key(s) not sent, e.g. {unknown[0]!r}"
    for key, array in arrays.items():
        spec = sent[key]
        if tuple(array.shape) != spec.shape:
            return f"key {key!r} has shape {tuple(array.shape)}, sent {spec.shape}"
        if str(array.dtype) != spec.dtype:
            return f"key {key!r} has dtype {array.dtype}, sent {spec.dtype}"
        values = array.numpy()
        if np.issubdtype(values.dtype, np.floating) and not np.isfinite(values).all():
            return f"key {key!r} has non-finite values"
    return None


def check_reply(
    message: Message,
    *,
    sent: Mapping[str, ArraySpec] | None = None,
    counts: Iterable[str] = ("num-examples",),
    arrays_required: bool = True,
) -> str | None:
    """Why ``message`` must be dropped, or ``None`` if it is well-formed.

    Parameters
    ----------
    message : Message
        A reply without error (check ``has_error()`` first).
    sent : mapping, optional
        Specs of the arrays sent to this node; ``None`` means no arrays expected.
    counts : iterable of str
        Metric names that must be present and non-negative.
    arrays_required : bool
        Whether an empty ``ArrayRecord`` is a reason to drop the reply.
    """
    content = message.content
    metrics = content.metric_records.get(METRICS)
    if metrics is None:
        return f"no MetricRecord {METRICS!r}"
    reason = _check_metrics(metrics, counts)
    if reason is not None:
        return reason
    if sent is None:
        return None
    arrays = content.array_records.get(ARRAYS)
    if arrays is None:
        return f"no ArrayRecord {ARRAYS!r}"
    try:
        return _check_arrays(arrays, sent, arrays_required)
    except (ValueError, TypeError) as exc:  # undecodable array payload
        return f"malformed arrays: {exc}"
