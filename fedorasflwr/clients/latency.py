"""The client side of ``query.latency``: this node's latency table, measured once and cached.

The node rebuilds the space from the message's ``space.<kwarg>`` entries, times it on its
own device (``fedorasflwr.training.torch_device``: the node config's ``device``) with its
own torch threads (the node config's ``num-threads``), validates the table against sampled
subnets, and replies with it (``fedorasflwr.latency``: the records). The table is cached
on the node's disk, one JSON file per space spec, device, threads, host, torch version and
request, so a second query (another run, another process) does not measure again.

Cache files live in ``$FEDORASFLWR_CACHE/latency`` (default ``~/.cache/fedorasflwr/latency``),
are written atomically (a temporary file, then ``os.replace``) and carry a SHA-256 digest
of their content: a file that does not parse, whose digest, key or shape does not match,
or with a non-finite entry is ignored with a WARNING and measured again. Processes of one
host that ask for the same table at once (the simulation engine's ClientApp workers) take
turns on an exclusive lock next to the file (``fcntl.flock``, POSIX): the first measures,
the others read its table, so the nodes of one host and configuration hold one table
instead of several timings of the same device.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch
from flwr.app import ConfigRecord, MetricRecord, RecordDict

from .. import latency
from ..latency import LatencyRequest, LatencyTable, LatencyValidation
from ..protocol import CONFIG, LATENCY, METRICS, space_from_config
from ..search_spaces import SearchSpace, build_space
from ..search_spaces.cost_cache import read_cache_file, write_cache_file
from ..training import torch_device

__all__ = ["answer_latency", "cache_path", "cached_table", "latency_cache_dir"]

_LOG = logging.getLogger(__name__)
FORMAT_VERSION = 1
DIGEST = "digest"


def latency_cache_dir() -> Path:
    """``$FEDORASFLWR_CACHE/latency``, else ``~/.cache/fedorasflwr/latency``."""
    root = os.environ.get("FEDORASFLWR_CACHE", "") or "~/.cache/fedorasflwr"
    return Path(root).expanduser() / "latency"


def _hardware(device: torch.device) -> dict[str, Any]:
    """What the numbers depend on besides the request: host, CPU, accelerator, threads."""
    cuda = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    return {
        "host": platform.node(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cuda": cuda,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }


def _key(space: SearchSpace, device: torch.device, request: LatencyRequest) -> dict[str, Any]:
    return {
        "spec": space.spec,
        **_hardware(device),
        "request": request.to_config(),
        "format": FORMAT_VERSION,
    }


def _digest(content: Any) -> str:
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def cache_path(space: SearchSpace, device: torch.device, request: LatencyRequest) -> Path:
    """The cache file of this space's table on this node's device and threads."""
    return latency_cache_dir() / (_digest(_key(space, device, request))[:24] + ".json")


def _table_to_json(table: LatencyTable) -> dict[str, Any]:
    check = table.validation
    return {
        "device": table.device,
        "threads": table.threads,
        "option-ms": [list(layer) for layer in table.option_ms],
        "fixed-ms": table.fixed_ms,
        "repeats": table.repeats,
        "warmup": table.warmup,
        "statistic": table.statistic,
        "validation": None
        if check is None
        else [check.paths, check.spearman_rho, check.relative_error, check.relative_error_p90],
    }


def _table_from_json(data: dict[str, Any], space: SearchSpace) -> LatencyTable:
    layers = data["option-ms"]
    if [len(layer) for layer in layers] != list(space.num_options()):
        raise ValueError("the table's shape differs from the space's")
    values = [float(v) for layer in layers for v in layer] + [float(data["fixed-ms"])]
    if not all(math.isfinite(v) and v >= 0 for v in values):
        raise ValueError("an entry is not a finite number >= 0")
    check = data["validation"]
    return LatencyTable(
        spec=space.spec,
        device=str(data["device"]),
        threads=int(data["threads"]),
        option_ms=tuple(tuple(float(v) for v in layer) for layer in layers),
        fixed_ms=float(data["fixed-ms"]),
        repeats=int(data["repeats"]),
        warmup=int(data["warmup"]),
        statistic=str(data["statistic"]),
        validation=None
        if check is None
        else LatencyValidation(int(check[0]), float(check[1]), float(check[2]), float(check[3])),
    )


def _read(path: Path, key: dict[str, Any], space: SearchSpace) -> LatencyTable | None:
    payload = read_cache_file(path, "latency cache")
    if payload is None:
        return None
    try:
        stored = payload.pop(DIGEST)
        if stored != _digest(payload):
            raise ValueError("digest mismatch (corrupt file)")
        if payload["key"] != json.loads(json.dumps(key)):
            raise ValueError("written for another space, device or request")
        return _table_from_json(payload["table"], space)
    except (AttributeError, KeyError, TypeError, ValueError, IndexError) as exc:
        _LOG.warning("latency cache %s is invalid (%s): measuring again", path, exc)
        return None


def _write(path: Path, key: dict[str, Any], table: LatencyTable) -> None:
    """Best effort: a read-only disk only logs."""
    payload: dict[str, Any] = {"key": key, "table": _table_to_json(table)}
    payload[DIGEST] = _digest(payload)
    write_cache_file(path, json.dumps(payload, sort_keys=True), "latency cache")


def _lock(path: Path) -> IO[str] | None:
    """An exclusive lock on ``<path>.lock`` (held until the returned file is closed), or
    None where there is none to take (not POSIX, or a read-only cache directory)."""
    try:
        import fcntl
    except ImportError:
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path.with_suffix(".lock"), "a")  # noqa: SIM115 - closed by the caller
    except OSError:
        return None
    fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


def cached_table(
    space: SearchSpace, request: LatencyRequest, device: torch.device | None = None
) -> tuple[LatencyTable, bool]:
    """This node's table of ``space`` (from its cache, else measured and stored), and
    whether it was measured now."""
    return cached(
        space, request, device, lambda d: latency.measure_and_validate(space, request, device=d)
    )


def cached(
    space: SearchSpace,
    request: LatencyRequest,
    device: torch.device | None,
    measure: Callable[[torch.device], LatencyTable],
) -> tuple[LatencyTable, bool]:
    """The cached table of ``space`` (anything with a ``spec`` and ``num_options``, such as
    DecNAS's layer layout), else ``measure(device)``'s, stored; and whether it was measured
    now. Processes of one host that ask at once measure once: the first takes the cache
    file's lock and measures, the others wait and read what it wrote."""
    device = torch_device() if device is None else torch.device(device)
    key = _key(space, device, request)
    path = cache_path(space, device, request)
    table = _read(path, key, space)
    if table is not None:
        return table, False
    lock = _lock(path)
    try:
        table = _read(path, key, space) if lock is not None else None  # measured meanwhile?
        if table is not None:
            return table, False
        table = measure(device)
        _write(path, key, table)
        return table, True
    finally:
        if lock is not None:
            lock.close()  # releases the lock


def answer_latency(content: RecordDict) -> RecordDict:
    """The reply to ``query.latency``: ``metrics`` (the table, its validation) and the
    ConfigRecord ``latency`` (device, statistic); see ``docs/protocol.md``."""
    config = content.config_records[CONFIG]
    request = LatencyRequest.from_config(config)
    space = build_space(**space_from_config(config))
    table, measured = cached_table(space, request)
    return RecordDict(
        {
            METRICS: MetricRecord(latency.table_metrics(table, measured=measured)),
            LATENCY: ConfigRecord(latency.table_config(table)),
        }
    )
