"""Latency lookup tables measured where the model will run (both sides use this module).

A node times every option of a search space on the input its layer sees, at batch 1, on
its own device and thread count: ``warmup`` untimed calls, then the median of ``repeats``
timed ones (``time.perf_counter``, ``torch.inference_mode``, eval mode, CUDA synchronised).
The parts no option owns (stem, head, the sums between layers, Python dispatch) are one
*fixed* term: the median over a few paths of (end-to-end time of the path's subnet minus
the sum of its options), at least 0. A path's table latency is then

    ``fixed_ms + sum(option_ms[layer][arch[layer]])``   (:func:`path_latency`)

:func:`validate` checks a table against the end-to-end timing of sampled subnets:
Spearman's rank correlation and the relative error of the prediction.

The records of the ``query.latency`` reply are laid out here (:func:`table_metrics`,
:func:`table_from_records`, :func:`latency_problem`), so the client that answers and the
server that checks agree on them. See ``docs/latency.md``.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from .search_spaces.base import SearchSpace
from .seeding import numpy_stream
from .training import torch_device

__all__ = [
    "DEFAULT_REPEATS",
    "DEFAULT_WARMUP",
    "LatencyRequest",
    "LatencyTable",
    "LatencyValidation",
    "latency_problem",
    "measure_and_validate",
    "measure_paths",
    "measure_table",
    "path_latency",
    "sample_paths",
    "spearman",
    "table_config",
    "table_from_records",
    "table_metrics",
    "validate",
]

DEFAULT_REPEATS = 20
DEFAULT_WARMUP = 5
DEFAULT_STATISTIC = "median"
FIXED_PATHS = 5  # paths whose end-to-end time minus their options gives the fixed term
PATH_CHUNK = 50  # subnets held and timed interleaved at once
#: what times a call: ``"wall"`` (``time.perf_counter``, what a user waits: the default) or
#: ``"cpu"`` (``time.process_time``: the CPU time of every thread of the process, blind to
#: other processes' load; for one thread on the CPU only, where it equals the wall time
#: of an unloaded host)
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}
#: how the timed calls of one option (or path) reduce to its milliseconds
STATISTICS: dict[str, Callable[[Sequence[float]], float]] = {
    "median": statistics.median,
    "min": min,
}

# reply keys (MetricRecord ``metrics`` and ConfigRecord ``latency`` of a ``query.latency`` reply)
OPTION_MS = "option-ms"
FIXED_MS = "fixed-ms"
THREADS = "threads"
MEASURED = "measured"
VALIDATION_PATHS = "validation-paths"
SPEARMAN_RHO = "spearman-rho"
RELATIVE_ERROR = "relative-error"
RELATIVE_ERROR_P90 = "relative-error-p90"
DEVICE = "device"
STATISTIC = "statistic"
# request keys (ConfigRecord ``config`` of a ``query.latency`` message)
REPEATS = "repeats"
WARMUP = "warmup"
SEED = "seed"


@dataclass(frozen=True)
class LatencyValidation:
    """A table against the measured end-to-end latency of ``paths`` sampled subnets."""

    paths: int
    spearman_rho: float
    relative_error: float  # median of |predicted - measured| / measured
    relative_error_p90: float
    predicted_ms: tuple[float, ...] = field(default=(), repr=False)
    measured_ms: tuple[float, ...] = field(default=(), repr=False)


@dataclass(frozen=True)
class LatencyTable:
    """Milliseconds per option (layer-major) and of the fixed parts, on one device.

    ``spec`` is the space's spec it was measured for; ``device`` and ``threads`` what it
    ran on (torch's intra-op threads); ``validation`` its check against sampled subnets.
    """

    spec: Mapping[str, Any]
    device: str
    threads: int
    option_ms: tuple[tuple[float, ...], ...]
    fixed_ms: float
    repeats: int = DEFAULT_REPEATS
    warmup: int = DEFAULT_WARMUP
    statistic: str = DEFAULT_STATISTIC
    validation: LatencyValidation | None = None
    clock: str = "wall"

    def num_options(self) -> tuple[int, ...]:
        return tuple(len(layer) for layer in self.option_ms)

    def path_ms(self, arch: Sequence[int]) -> float:
        """Table latency of ``arch``: the fixed part plus its options (:func:`path_latency`)."""
        return path_latency(self, arch)


def path_latency(table: LatencyTable, arch: Sequence[int]) -> float:
    """``table.fixed_ms`` plus the milliseconds of each layer's chosen option."""
    if len(arch) != len(table.option_ms):
        raise ValueError(f"arch has {len(arch)} entries, the table {len(table.option_ms)} layers")
    return table.fixed_ms + sum(layer[o] for layer, o in zip(table.option_ms, arch, strict=True))


def group_table(tables: Sequence[LatencyTable]) -> LatencyTable:
    """One table standing for a group of devices (a tier, a cluster, the target nodes):
    per option and for the fixed part, the median over the group's tables, so that one
    slow or fast outlier moves no entry. The tables must be of one space."""
    if not tables:
        raise ValueError("no latency table in the group")
    shapes = {t.num_options() for t in tables}
    specs = {repr(sorted(dict(t.spec).items())) for t in tables}
    if len(shapes) != 1 or len(specs) != 1:
        raise ValueError("the group's latency tables are of different spaces")
    first = tables[0]
    if len(tables) == 1:
        return first
    option_ms = tuple(
        tuple(float(np.median([t.option_ms[i][o] for t in tables])) for o in range(n))
        for i, n in enumerate(first.num_options())
    )
    devices = sorted({t.device for t in tables})
    return replace(
        first,
        device=",".join(devices),
        threads=int(np.median([t.threads for t in tables])),
        option_ms=option_ms,
        fixed_ms=float(np.median([t.fixed_ms for t in tables])),
        validation=None,
    )


def table_document(table: LatencyTable) -> dict[str, Any]:
    """A table as JSON for ``result.json``: what it was measured on, its entries, the
    range of its paths and its validation on the node."""
    doc: dict[str, Any] = {
        "device": table.device,
        "threads": table.threads,
        "statistic": table.statistic,
        "fixed-ms": table.fixed_ms,
        "option-ms": [list(layer) for layer in table.option_ms],
        "min-path-ms": table.fixed_ms + sum(min(layer) for layer in table.option_ms),
        "max-path-ms": table.fixed_ms + sum(max(layer) for layer in table.option_ms),
    }
    check = table.validation
    if check is not None:
        doc["validation"] = {
            "paths": check.paths,
            "spearman-rho": check.spearman_rho,
            "relative-error": check.relative_error,
            "relative-error-p90": check.relative_error_p90,
        }
    return doc


# --------------------------------------------------------------------------- timing


def _synchronize(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def _timed_ms(
    runs: Sequence[Callable[[], Any]],
    repeats: int,
    warmup: int,
    sync: Callable[[], None],
    statistic: Callable[[Sequence[float]], float],
    clock: Callable[[], float] = time.perf_counter,
) -> list[float]:
    """Milliseconds of each of ``runs``: ``warmup`` untimed calls each, then ``repeats``
    timed rounds over all of them (interleaved, so a change in the load of a shared host
    hits every run alike), reduced by ``statistic``."""
    for run in runs:
        for _ in range(warmup):
            run()
    sync()
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(repeats):
        for run, kept in zip(runs, times, strict=True):
            started = clock()
            run()
            sync()
            kept.append(clock() - started)
    return [1e3 * statistic(kept) for kept in times]


def _check_counts(repeats: int, warmup: int) -> None:
    if isinstance(repeats, bool) or int(repeats) < 1:
        raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")
    if isinstance(warmup, bool) or int(warmup) < 0:
        raise ValueError(f"warmup must be an integer >= 0, got {warmup!r}")


def _input(space: SearchSpace, device: torch.device) -> Tensor:
    return torch.zeros((1, *space.input_shape), dtype=space.input_dtype, device=device)


def _layer_inputs(space: SearchSpace, x: Tensor) -> list[Tensor]:
    """The input each searchable layer sees on one pass of path 0 (forward pre-hooks)."""
    mixed = [space.net.get_submodule(choice.name) for choice in space.choices]
    seen: dict[int, Tensor] = {}

    def record(layer: int) -> Callable[[nn.Module, tuple[Any, ...]], None]:
        def hook(_module: nn.Module, args: tuple[Any, ...]) -> None:
            seen[layer] = args[0]

        return hook

    hooks = [m.register_forward_pre_hook(record(layer)) for layer, m in enumerate(mixed)]
    try:
        space(x, (0,) * len(mixed))
    finally:
        for hook in hooks:
            hook.remove()
    return [seen[layer] for layer in range(len(mixed))]


def _statistic(name: str) -> Callable[[Sequence[float]], float]:
    if name not in STATISTICS:
        raise ValueError(f"statistic {name!r} is unknown; valid: {', '.join(STATISTICS)}")
    return STATISTICS[name]


def _clock(name: str, device: torch.device) -> Callable[[], float]:
    if name not in CLOCKS:
        raise ValueError(f"clock {name!r} is unknown; valid: {', '.join(CLOCKS)}")
    if name == "cpu" and device.type != "cpu":
        raise ValueError(f"clock 'cpu' times the CPU only, not {device}; use clock 'wall'")
    return CLOCKS[name]


def measure_paths(
    space: SearchSpace,
    paths: Sequence[Sequence[int]],
    *,
    device: torch.device | str | None = None,
    repeats: int = DEFAULT_REPEATS,
    warmup: int = DEFAULT_WARMUP,
    statistic: str = DEFAULT_STATISTIC,
    clock: str = "wall",
) -> list[float]:
    """Measured milliseconds of one forward pass of each ``space.subnet(arch)`` at batch 1
    (the subnets timed interleaved, :data:`PATH_CHUNK` at a time)."""
    _check_counts(repeats, warmup)
    reduce = _statistic(statistic)
    device = torch.device(device) if device is not None else torch_device()
    timer = _clock(clock, device)
    x = _input(space, device)
    measured: list[float] = []
    with torch.inference_mode():
        for start in range(0, len(paths), PATH_CHUNK):
            subnets = [space.subnet(a).to(device).eval() for a in paths[start : start + PATH_CHUNK]]
            runs = [lambda net=net: net(x) for net in subnets]
            measured += _timed_ms(runs, repeats, warmup, _synchronize(device), reduce, timer)
    return measured


def sample_paths(space: SearchSpace, count: int, seed: int, purpose: str) -> list[tuple[int, ...]]:
    """``count`` uniform paths of ``space`` from the named stream ``(seed, purpose)``."""
    rng = numpy_stream(seed, purpose)
    return [space.sample_path(rng) for _ in range(count)]


def measure_table(
    space: SearchSpace,
    *,
    device: torch.device | str | None = None,
    repeats: int = DEFAULT_REPEATS,
    warmup: int = DEFAULT_WARMUP,
    statistic: str = DEFAULT_STATISTIC,
    fixed_paths: int = FIXED_PATHS,
    seed: int = 0,
    clock: str = "wall",
) -> LatencyTable:
    """Time every option of ``space`` on its layer's input, and the fixed parts.

    Parameters
    ----------
    space : SearchSpace
        The supernet (its weights are used as they are; it is left as it was).
    device : torch.device or str, optional
        Where to time; default: :func:`fedorasflwr.training.torch_device` (the node's).
    repeats, warmup : int
        Timed and untimed calls per option (the timed ones interleaved over all options).
    statistic : str
        How the timed calls of one option reduce: ``"median"`` (default) or ``"min"``.
    fixed_paths : int
        Paths (stream ``(seed, "latency-fixed")``) whose end-to-end time minus the sum
        of their options, medianed, is the fixed term (at least 0).
    clock : str
        ``"wall"`` (default) or ``"cpu"`` (:data:`CLOCKS`).
    """
    _check_counts(repeats, warmup)
    reduce = _statistic(statistic)
    device = torch.device(device) if device is not None else torch_device()
    timer = _clock(clock, device)
    was_training, original = space.training, next(space.parameters()).device
    space.to(device).eval()
    try:
        with torch.inference_mode():
            inputs = _layer_inputs(space, _input(space, device))
            runs = []
            for choice, x in zip(space.choices, inputs, strict=True):
                mixed = space.net.get_submodule(choice.name)
                runs += [lambda op=mixed.ops[key], x=x: op(x) for key in mixed.option_keys]
            flat = _timed_ms(runs, repeats, warmup, _synchronize(device), reduce, timer)
    finally:
        space.to(original).train(was_training)
    offsets = np.cumsum([0, *space.num_options()])
    option_ms = tuple(tuple(flat[a:b]) for a, b in zip(offsets[:-1], offsets[1:], strict=True))
    table = LatencyTable(
        space.spec,
        str(device),
        torch.get_num_threads(),
        option_ms,
        0.0,
        repeats,
        warmup,
        statistic,
        clock=clock,
    )
    paths = sample_paths(space, max(1, fixed_paths), seed, "latency-fixed")
    ends = measure_paths(
        space,
        paths,
        device=device,
        repeats=repeats,
        warmup=warmup,
        statistic=statistic,
        clock=clock,
    )
    rests = [end - path_latency(table, arch) for end, arch in zip(ends, paths, strict=True)]
    return replace(table, fixed_ms=max(0.0, statistics.median(rests)))


# ----------------------------------------------------------------------- validation


def _ranks(values: Sequence[float]) -> np.ndarray:
    """Ranks 1..n, ties given their average rank."""
    data = np.asarray(values, dtype=float)
    order = np.argsort(data, kind="mergesort")
    ranks = np.empty(len(data))
    sorted_values = data[order]
    start = 0
    while start < len(data):
        end = start
        while end + 1 < len(data) and sorted_values[end + 1] == sorted_values[start]:
            end += 1
        ranks[order[start : end + 1]] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation (Pearson's on average ranks); NaN if a side is constant."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(f"spearman needs two equal lengths >= 2, got {len(a)} and {len(b)}")
    ra, rb = _ranks(a) - (len(a) + 1) / 2, _ranks(b) - (len(b) + 1) / 2
    denominator = math.sqrt(float(ra @ ra) * float(rb @ rb))
    return float(ra @ rb) / denominator if denominator > 0 else math.nan


def validate(
    table: LatencyTable,
    space: SearchSpace,
    paths: Sequence[Sequence[int]],
    *,
    device: torch.device | str | None = None,
    repeats: int | None = None,
    warmup: int | None = None,
) -> LatencyValidation:
    """Table latency of each of ``paths`` against its subnet's measured latency (same
    device, repeats, warm-up and statistic as the table unless given)."""
    if len(paths) < 2:
        raise ValueError(f"validation needs at least 2 paths, got {len(paths)}")
    predicted = [path_latency(table, arch) for arch in paths]
    measured = measure_paths(
        space,
        paths,
        device=device if device is not None else table.device,
        repeats=table.repeats if repeats is None else repeats,
        warmup=table.warmup if warmup is None else warmup,
        statistic=table.statistic,
        clock=table.clock,
    )
    return compare(predicted, measured)


def compare(predicted: Sequence[float], measured: Sequence[float]) -> LatencyValidation:
    """Predicted against measured milliseconds of the same nets: Spearman's rho, the
    median and 90th percentile of the relative error ``|predicted - measured| / measured``."""
    errors = [abs(p - m) / m for p, m in zip(predicted, measured, strict=True)]
    return LatencyValidation(
        paths=len(predicted),
        spearman_rho=spearman(predicted, measured),
        relative_error=float(np.median(errors)),
        relative_error_p90=float(np.quantile(errors, 0.9)),
        predicted_ms=tuple(predicted),
        measured_ms=tuple(measured),
    )


# -------------------------------------------------------------------------- records


@dataclass(frozen=True)
class LatencyRequest:
    """What a ``query.latency`` message asks for (its ``config`` entries besides the space).

    ``validation_paths`` subnets (stream ``(seed, "latency-paths")``) are timed end to end
    against the table; fewer than 2: no validation.
    """

    repeats: int = DEFAULT_REPEATS
    warmup: int = DEFAULT_WARMUP
    statistic: str = DEFAULT_STATISTIC
    validation_paths: int = 20
    seed: int = 0

    def __post_init__(self) -> None:
        _check_counts(self.repeats, self.warmup)
        _statistic(self.statistic)
        if isinstance(self.validation_paths, bool) or self.validation_paths < 0:
            raise ValueError(f"validation_paths must be >= 0, got {self.validation_paths!r}")

    def to_config(self) -> dict[str, Any]:
        return {
            REPEATS: int(self.repeats),
            WARMUP: int(self.warmup),
            STATISTIC: self.statistic,
            VALIDATION_PATHS: int(self.validation_paths),
            SEED: int(self.seed),
        }

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> LatencyRequest:
        """The request in a message's config (defaults for absent keys)."""
        default = cls()
        return cls(
            repeats=int(config.get(REPEATS, default.repeats)),
            warmup=int(config.get(WARMUP, default.warmup)),
            statistic=str(config.get(STATISTIC, default.statistic)),
            validation_paths=int(config.get(VALIDATION_PATHS, default.validation_paths)),
            seed=int(config.get(SEED, default.seed)),
        )


def measure_and_validate(
    space: SearchSpace, request: LatencyRequest, *, device: torch.device | str | None = None
) -> LatencyTable:
    """The table ``request`` asks for, with its validation when it asks for one."""
    table = measure_table(
        space,
        device=device,
        repeats=request.repeats,
        warmup=request.warmup,
        statistic=request.statistic,
        seed=request.seed,
    )
    if request.validation_paths < 2:
        return table
    paths = sample_paths(space, request.validation_paths, request.seed, "latency-paths")
    return replace(table, validation=validate(table, space, paths))


def table_metrics(table: LatencyTable, *, measured: bool) -> dict[str, Any]:
    """The ``metrics`` of a ``query.latency`` reply (``measured``: 1 if timed for this
    reply, 0 if read from the node's cache)."""
    metrics: dict[str, Any] = {
        OPTION_MS: [float(v) for layer in table.option_ms for v in layer],
        FIXED_MS: float(table.fixed_ms),
        THREADS: int(table.threads),
        MEASURED: int(measured),
        REPEATS: int(table.repeats),
        WARMUP: int(table.warmup),
    }
    check = table.validation
    if check is not None and math.isfinite(check.spearman_rho):
        metrics.update(
            {
                VALIDATION_PATHS: int(check.paths),
                SPEARMAN_RHO: float(check.spearman_rho),
                RELATIVE_ERROR: float(check.relative_error),
                RELATIVE_ERROR_P90: float(check.relative_error_p90),
            }
        )
    return metrics


def table_config(table: LatencyTable) -> dict[str, str]:
    """The ConfigRecord ``latency`` of a ``query.latency`` reply: what it was measured on."""
    return {DEVICE: table.device, STATISTIC: table.statistic}


def latency_problem(
    metrics: Mapping[str, Any], config: Mapping[str, Any], num_options: Sequence[int]
) -> str | None:
    """Why the records of a ``query.latency`` reply are not a table of a space with
    ``num_options`` options per layer, or ``None``."""
    values = metrics.get(OPTION_MS)
    if not isinstance(values, list):
        return f"metric {OPTION_MS!r} missing or not a list"
    expected = sum(num_options)
    if len(values) != expected:
        return f"metric {OPTION_MS!r} has {len(values)} entries, the space {expected} options"
    if not all(isinstance(v, int | float) and math.isfinite(v) and v > 0 for v in values):
        return f"metric {OPTION_MS!r} has an entry that is not a finite number > 0"
    for name in (FIXED_MS, THREADS):
        value = metrics.get(name)
        if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            return f"metric {name!r} missing or not a finite number >= 0"
    if SPEARMAN_RHO in metrics:
        rho = metrics[SPEARMAN_RHO]
        if not isinstance(rho, int | float) or not math.isfinite(rho) or not -1 <= rho <= 1:
            return f"metric {SPEARMAN_RHO!r} = {rho!r} is not within [-1, 1]"
        for name in (VALIDATION_PATHS, RELATIVE_ERROR, RELATIVE_ERROR_P90):
            value = metrics.get(name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                return f"metric {name!r} missing or not a finite number >= 0"
    if not isinstance(config.get(DEVICE), str):
        return f"config {DEVICE!r} missing"
    if config.get(STATISTIC, DEFAULT_STATISTIC) not in STATISTICS:
        return f"config {STATISTIC!r} = {config.get(STATISTIC)!r} is unknown"
    return None


def table_from_records(
    metrics: Mapping[str, Any],
    config: Mapping[str, Any],
    spec: Mapping[str, Any],
    num_options: Sequence[int],
) -> LatencyTable:
    """The table a ``query.latency`` reply carries (check it with :func:`latency_problem`)."""
    flat = [float(v) for v in metrics[OPTION_MS]]
    offsets = np.cumsum([0, *num_options])
    validation = None
    if SPEARMAN_RHO in metrics:
        validation = LatencyValidation(
            paths=int(metrics[VALIDATION_PATHS]),
            spearman_rho=float(metrics[SPEARMAN_RHO]),
            relative_error=float(metrics[RELATIVE_ERROR]),
            relative_error_p90=float(metrics[RELATIVE_ERROR_P90]),
        )
    return LatencyTable(
        spec=dict(spec),
        device=str(config[DEVICE]),
        threads=int(metrics[THREADS]),
        option_ms=tuple(tuple(flat[a:b]) for a, b in zip(offsets[:-1], offsets[1:], strict=True)),
        fixed_ms=float(metrics[FIXED_MS]),
        repeats=int(metrics.get(REPEATS, DEFAULT_REPEATS)),
        warmup=int(metrics.get(WARMUP, DEFAULT_WARMUP)),
        statistic=str(config.get(STATISTIC, DEFAULT_STATISTIC)),
        validation=validation,
    )
