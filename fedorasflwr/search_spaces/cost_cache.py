"""Disk cache of a search space's measured cost tables.

Measuring a space's per-option FLOPs takes ~0.1 s per build plus ~1 s (many seconds
on a loaded host) for the first ``FlopCounterMode`` in a process.  On the deployment
engine every message is a fresh ClientApp process that rebuilds the supernet, so the
in-process memo of :mod:`.base` never hits there; this file cache does.  It lives in
``$FEDORASFLWR_CACHE/space-costs`` (default ``~/.cache/fedorasflwr/space-costs``), one
JSON file per space class, spec and torch version.

A file is used only if it parses, matches the space's shape (layers and options) and
its parameter counts equal the ones counted on the module just built (cheap, and a
corrupt or stale file fails it); otherwise it is ignored with a WARNING and
re-measured.  Writes are atomic (a temp file, then ``os.replace``), so processes
building the same space at once never read half a file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

__all__ = ["CostTables", "cost_cache_dir", "load_costs", "store_costs"]

_LOG = logging.getLogger(__name__)
FORMAT_VERSION = 1

#: (per layer, per option: (flops, params)), (fixed flops, fixed params)
CostTables = tuple[tuple[tuple[tuple[int, int], ...], ...], tuple[int, int]]


def cost_cache_dir() -> Path:
    """``$FEDORASFLWR_CACHE/space-costs``, else ``~/.cache/fedorasflwr/space-costs``."""
    root = os.environ.get("FEDORASFLWR_CACHE", "") or "~/.cache/fedorasflwr"
    return Path(root).expanduser() / "space-costs"


def _path(memo_key: Any) -> Path:
    text = json.dumps(
        {"key": repr(memo_key), "torch": torch.__version__, "format": FORMAT_VERSION},
        sort_keys=True,
    )
    return cost_cache_dir() / (hashlib.sha256(text.encode()).hexdigest()[:24] + ".json")


def load_costs(
    memo_key: Any, option_params: Sequence[Sequence[int]], total_params: int
) -> CostTables | None:
    """The cached tables for ``memo_key`` if present and consistent with the
    parameter counts of the space just built; else ``None``."""
    path = _path(memo_key)
    payload = read_cache_file(path, "space cost cache")
    if payload is None:
        return None
    problem = _problem(payload, option_params, total_params)
    if problem is not None:
        _LOG.warning("space cost cache %s is invalid (%s): measuring again", path, problem)
        return None
    layers = tuple(tuple((int(f), int(p)) for f, p in layer) for layer in payload["options"])
    fixed_flops, fixed_params = payload["fixed"]
    return layers, (int(fixed_flops), int(fixed_params))


def _problem(payload: Any, option_params: Sequence[Sequence[int]], total: int) -> str | None:
    if not isinstance(payload, dict) or not {"options", "fixed"} <= set(payload):
        return "not a cost table"
    layers, fixed = payload["options"], payload["fixed"]
    if not isinstance(layers, list) or len(layers) != len(option_params):
        return "wrong number of layers"
    pairs = [pair for layer in layers if isinstance(layer, list) for pair in layer] + [fixed]
    if not all(
        isinstance(pair, list) and len(pair) == 2 and all(type(v) is int and v >= 0 for v in pair)
        for pair in pairs
    ):
        return "entries must be [flops, params] pairs of non-negative integers"
    got = [[pair[1] for pair in layer] for layer in layers]
    if got != [list(layer) for layer in option_params]:
        return "option parameter counts differ from the space built"
    if sum(map(sum, got)) + fixed[1] != total:
        return "fixed parameter count differs from the space built"
    return None


def store_costs(memo_key: Any, tables: CostTables) -> None:
    """Write the tables for ``memo_key`` (best effort: a read-only disk only logs)."""
    path = _path(memo_key)
    layers, fixed = tables
    text = json.dumps(
        {"options": [[list(c) for c in layer] for layer in layers], "fixed": list(fixed)}
    )
    write_cache_file(path, text, "space cost cache")


def read_cache_file(path: Path, what: str) -> Any:
    """The JSON in ``path``; ``None`` (logged, so the caller measures again) if it is
    missing or unreadable."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        _LOG.warning("%s %s is unreadable (%s): measuring again", what, path, exc)
        return None


def write_cache_file(path: Path, text: str, what: str) -> None:
    """Write ``text`` to ``path`` atomically (temporary file + ``os.replace``); best
    effort: a read-only disk only logs."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            "w", dir=path.parent, prefix=path.name, suffix=".tmp", delete=False, encoding="utf-8"
        ) as sink:
            sink.write(text)
        os.replace(sink.name, path)
    except OSError as exc:
        _LOG.warning("could not write %s %s (%s)", what, path, exc)
