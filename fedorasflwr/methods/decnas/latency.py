"""NetAdapt's layer-wise latency look-up table of a prunable net (both sides use this module).

NetAdapt (Yang et al., 2018, §3.2) budgets by latency without running candidates: the
latency of every layer is measured beforehand for the numbers of input and output channels
it can take, and a net's latency is the sum of its layers' entries. Here a *unit* is a
leaf module of the net (a conv, linear, BN, pool ... layer) whose shapes depend on the
widths of some prunable layers, its *deps* (a conv: the layer before and its own; a BN
after it: its own). A unit's entries are its milliseconds at batch 1 on the input it sees,
for every combination of its deps' widths on a *grid*: per prunable layer of base width
``w``, ``{max(1, round(w * k / points)), k = 0..points}`` (1 and ``w`` included). A net of
any widths is predicted by multilinear interpolation between the grid points around its
widths (exact on the grid), plus a *fixed* part (what no unit owns: the input layers whose
shapes never change, functional activations, flattening, Python dispatch), the median over
a few grid nets of (end-to-end time minus the sum of its units), at least 0:

    ``latency(widths) = fixed_ms + sum_u interp(entries_u, widths[deps_u])``

The table is a :class:`fedorasflwr.latency.LatencyTable` whose "options" are the units'
entries (``spec``: the net's spec plus ``latency-grid``), so the records of the reply, the
server's checks, the node's disk cache and :func:`fedorasflwr.latency.group_table` (the
per-entry median of the target devices' tables) are those of ``query.latency``.

Timing is :mod:`fedorasflwr.latency`'s: batch 1, eval mode, ``torch.inference_mode``, the
node's device and threads, ``warmup`` untimed calls each, ``repeats`` timed rounds over
every entry (interleaved), their median (or min). Weights are constants (no random numbers
are drawn: a unit's speed does not depend on its values), inputs zeros.
"""

from __future__ import annotations

import copy
import itertools
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from ...latency import (
    LatencyRequest,
    LatencyTable,
    LatencyValidation,
    _check_counts,
    _clock,
    _statistic,
    _synchronize,
    _timed_ms,
    compare,
)
from ...search_spaces.prunable import meta_prunable
from ...seeding import numpy_stream
from ...training import torch_device

__all__ = [
    "DEFAULT_GRID",
    "GRID_KEY",
    "LayerLayout",
    "LayerUnit",
    "layer_layout",
    "measure_layer_table",
    "measure_nets",
    "predict_ms",
    "sample_widths",
    "width_grid",
]

DEFAULT_GRID = 8  # grid points per prunable layer (besides width 1): steps of 1/8 of its width
GRID_KEY = "latency-grid"  # the grid's points in the table's spec (and the message's space.*)
FIXED_NETS = 5  # grid nets whose end-to-end time minus their units gives the fixed part


@dataclass(frozen=True)
class LayerUnit:
    """A leaf module (``name`` in the model) whose shapes follow the widths of ``deps``."""

    name: str
    deps: tuple[int, ...]


@dataclass(frozen=True)
class LayerLayout:
    """The units of a net (``spec``'s widths are the base ones) and the widths grid."""

    net_spec: Mapping[str, Any]
    points: int
    grids: tuple[tuple[int, ...], ...]  # per prunable layer, its grid of widths
    units: tuple[LayerUnit, ...]

    @property
    def spec(self) -> dict[str, Any]:
        """The table's spec: the net's and the grid's points."""
        return {**self.net_spec, GRID_KEY: self.points}

    @property
    def base_widths(self) -> tuple[int, ...]:
        return tuple(int(w) for w in self.net_spec["widths"])

    def num_options(self) -> tuple[int, ...]:
        """Entries per unit (its deps' grid sizes multiplied), as a table's options."""
        return tuple(math.prod(len(self.grids[d]) for d in u.deps) for u in self.units)

    def combos(self, unit: LayerUnit) -> list[tuple[int, ...]]:
        """The unit's entries in table order: its deps' grid widths, the last dep fastest."""
        return list(itertools.product(*(self.grids[d] for d in unit.deps)))

    def widths_of(self, unit: LayerUnit, combo: Sequence[int]) -> tuple[int, ...]:
        """The base widths with the unit's deps at ``combo``."""
        widths = list(self.base_widths)
        for d, w in zip(unit.deps, combo, strict=True):
            widths[d] = int(w)
        return tuple(widths)


def width_grid(width: int, points: int = DEFAULT_GRID) -> tuple[int, ...]:
    """The widths a layer of ``width`` filters is measured at: 1, steps of width/points."""
    if points < 1:
        raise ValueError(f"a width grid needs at least 1 point, got {points}")
    return tuple(sorted({max(1, round(width * k / points)) for k in range(points + 1)}))


# --------------------------------------------------------------------------- layout


def _calls(net: nn.Module) -> dict[str, list[tuple[Any, ...]]]:
    """Per leaf module of ``net.model`` (storage-free), the arguments of each call in one
    forward pass at batch 1 (meta tensors: their shapes and dtypes)."""
    model = net.model
    seen: dict[str, list[tuple[Any, ...]]] = {}

    def record(name: str) -> Callable[[nn.Module, tuple[Any, ...]], None]:
        def hook(_module: nn.Module, args: tuple[Any, ...]) -> None:
            seen.setdefault(name, []).append(args)

        return hook

    leaves = [(n, m) for n, m in model.named_modules() if n and not list(m.children())]
    hooks = [m.register_forward_pre_hook(record(n)) for n, m in leaves]
    try:
        # storage-free, unless the model traces on the CPU only (data-dependent shapes)
        device = next((t.device for t in (*model.parameters(), *model.buffers())), "meta")
        x = torch.zeros((1, *net.input_shape), device=device)
        with torch.no_grad():
            model.eval()(x)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def _signature(module: nn.Module, calls: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    shapes = tuple(tuple(p.shape) for p in (*module.parameters(), *module.buffers()))
    inputs = tuple(
        tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else repr(a) for a in args)
        for args in calls
    )
    return shapes, inputs


def _signatures(spec: Mapping[str, Any]) -> dict[str, tuple[Any, ...]]:
    net = meta_prunable(spec)
    return {
        name: _signature(net.model.get_submodule(name), calls)
        for name, calls in _calls(net).items()
    }


def layer_layout(spec: Mapping[str, Any], points: int = DEFAULT_GRID) -> LayerLayout:
    """The units of the prunable net ``spec`` (its widths are the table's base widths):
    a leaf module is a unit of the layers whose width, set to 1 alone, changes its
    parameters' or inputs' shapes. Deterministic: client and server compute it alike."""
    net_spec = {k: v for k, v in dict(spec).items() if k != GRID_KEY}
    base = [int(w) for w in net_spec["widths"]]
    grids = tuple(width_grid(w, points) for w in base)
    reference = _signatures(net_spec)
    deps: dict[str, list[int]] = {}
    for layer, width in enumerate(base):
        if width <= 1:
            continue
        changed = _signatures(
            {**net_spec, "widths": [1 if i == layer else w for i, w in enumerate(base)]}
        )
        for name, signature in reference.items():
            if changed.get(name) != signature:
                deps.setdefault(name, []).append(layer)
    units = tuple(LayerUnit(name, tuple(deps[name])) for name in reference if name in deps)
    return LayerLayout(net_spec, int(points), grids, units)


# -------------------------------------------------------------------------- predict


def _corners(grid: Sequence[int], width: float) -> list[tuple[int, float]]:
    """(grid index, weight) of the one or two grid points around ``width``."""
    if not grid[0] <= width <= grid[-1]:
        raise ValueError(f"width {width} is outside the table's grid {grid[0]}..{grid[-1]}")
    upper = int(np.searchsorted(grid, width, side="left"))
    if grid[upper] == width:
        return [(upper, 1.0)]
    low, high = grid[upper - 1], grid[upper]
    share = (width - low) / (high - low)
    return [(upper - 1, 1.0 - share), (upper, share)]


def unit_ms(table: LatencyTable, layout: LayerLayout, index: int, widths: Sequence[int]) -> float:
    """Unit ``index``'s milliseconds at ``widths``: multilinear between its grid entries."""
    unit = layout.units[index]
    entries = table.option_ms[index]
    sizes = [len(layout.grids[d]) for d in unit.deps]
    total = 0.0
    for corner in itertools.product(*(_corners(layout.grids[d], widths[d]) for d in unit.deps)):
        flat, weight = 0, 1.0
        for (position, share), size in zip(corner, sizes, strict=True):
            flat, weight = flat * size + position, weight * share
        total += weight * entries[flat]
    return total


def predict_ms(table: LatencyTable, layout: LayerLayout, widths: Sequence[int]) -> float:
    """A net's table latency at ``widths``: the fixed part plus every unit's entry."""
    if len(widths) != len(layout.grids):
        raise ValueError(f"{len(widths)} widths for a net of {len(layout.grids)} prunable layers")
    if table.num_options() != layout.num_options():
        raise ValueError("the latency table does not fit the net's layout")
    units = sum(unit_ms(table, layout, i, widths) for i in range(len(layout.units)))
    return table.fixed_ms + units


# -------------------------------------------------------------------------- measure


def _fill(module: nn.Module) -> nn.Module:
    """Constant weights (no random draw): matrices 1/fan-in (an average), vectors 1."""
    with torch.no_grad():
        for tensor in (*module.parameters(), *module.buffers()):
            if tensor.is_floating_point():
                fan_in = tensor[0].numel() if tensor.dim() > 1 else 0
                tensor.fill_(1.0 / fan_in if fan_in else 1.0)
    return module.eval()


def _materialise(module: nn.Module, device: torch.device) -> nn.Module:
    return _fill(copy.deepcopy(module).to_empty(device=device))


def _real(arg: Any, device: torch.device) -> Any:
    if isinstance(arg, torch.Tensor):
        return torch.zeros(arg.shape, dtype=arg.dtype, device=device)
    return arg


def _unit_runs(layout: LayerLayout, device: torch.device) -> list[Callable[[], Any]]:
    """One call per entry (table order): the unit, at its entry's widths, on its inputs."""
    nets: dict[tuple[int, ...], tuple[nn.Module, dict[str, list[tuple[Any, ...]]]]] = {}
    runs = []
    for unit in layout.units:
        for combo in layout.combos(unit):
            widths = layout.widths_of(unit, combo)
            if widths not in nets:
                net = meta_prunable({**layout.net_spec, "widths": list(widths)})
                nets[widths] = (net, _calls(net))
            net, calls = nets[widths]
            module = _materialise(net.model.get_submodule(unit.name), device)
            inputs = [tuple(_real(a, device) for a in args) for args in calls[unit.name]]
            runs.append(lambda m=module, inputs=inputs: [m(*args) for args in inputs])
    return runs


def measure_nets(
    layout: LayerLayout,
    widths: Sequence[Sequence[int]],
    *,
    device: torch.device | str | None = None,
    repeats: int,
    warmup: int,
    statistic: str = "median",
    clock: str = "wall",
) -> list[float]:
    """Measured milliseconds of one forward pass at batch 1 of the net at each ``widths``
    (constant weights, timed interleaved)."""
    _check_counts(repeats, warmup)
    device = torch.device(device) if device is not None else torch_device()
    nets = [
        _materialise(meta_prunable({**layout.net_spec, "widths": list(w)}), device) for w in widths
    ]
    x = torch.zeros((1, *nets[0].input_shape), device=device) if nets else None
    runs = [lambda net=net: net(x) for net in nets]
    with torch.inference_mode():
        return _timed_ms(
            runs,
            repeats,
            warmup,
            _synchronize(device),
            _statistic(statistic),
            _clock(clock, device),
        )


def sample_widths(
    layout: LayerLayout, count: int, seed: int, purpose: str
) -> list[tuple[int, ...]]:
    """``count`` nets from the stream ``(seed, purpose)``: each layer a uniform share of
    its base width in [1/4, 1] (a candidate range NetAdapt's steps visit), at least 1."""
    rng = numpy_stream(seed, purpose)
    return [
        tuple(max(1, round(w * float(rng.uniform(0.25, 1.0)))) for w in layout.base_widths)
        for _ in range(count)
    ]


def _grid_nets(layout: LayerLayout, count: int, seed: int) -> list[tuple[int, ...]]:
    """The base net and ``count - 1`` nets with every width a random grid point."""
    rng = numpy_stream(seed, "decnas-latency-fixed")
    nets = [layout.base_widths]
    for _ in range(count - 1):
        nets.append(tuple(int(g[int(rng.integers(len(g)))]) for g in layout.grids))
    return nets


def measure_layer_table(
    layout: LayerLayout,
    request: LatencyRequest,
    *,
    device: torch.device | str | None = None,
    clock: str = "wall",
) -> LatencyTable:
    """Time every entry of ``layout`` and the fixed part; validate against
    ``request.validation_paths`` nets timed end to end (fewer than 2: no validation)."""
    device = torch.device(device) if device is not None else torch_device()
    timing = {
        "repeats": request.repeats,
        "warmup": request.warmup,
        "statistic": request.statistic,
        "clock": clock,
    }
    _check_counts(request.repeats, request.warmup)
    with torch.inference_mode():
        flat = _timed_ms(
            _unit_runs(layout, device),
            request.repeats,
            request.warmup,
            _synchronize(device),
            _statistic(request.statistic),
            _clock(clock, device),
        )
    offsets = np.cumsum([0, *layout.num_options()])
    table = LatencyTable(
        layout.spec,
        str(device),
        torch.get_num_threads(),
        tuple(tuple(flat[a:b]) for a, b in zip(offsets[:-1], offsets[1:], strict=True)),
        0.0,
        request.repeats,
        request.warmup,
        request.statistic,
        clock=clock,
    )
    nets = _grid_nets(layout, FIXED_NETS, request.seed)
    ends = measure_nets(layout, nets, device=device, **timing)
    rests = [end - predict_ms(table, layout, w) for end, w in zip(ends, nets, strict=True)]
    table = replace(table, fixed_ms=max(0.0, statistics.median(rests)))
    if request.validation_paths < 2:
        return table
    checked = sample_widths(layout, request.validation_paths, request.seed, "latency-paths")
    measured = measure_nets(layout, checked, device=device, **timing)
    return replace(table, validation=validation(table, layout, checked, measured))


def validation(
    table: LatencyTable,
    layout: LayerLayout,
    widths: Sequence[Sequence[int]],
    measured: Sequence[float],
) -> LatencyValidation:
    """The table's predictions of the nets at ``widths`` against their ``measured`` ms:
    Spearman's rho, the median and 90th percentile of the relative error."""
    return compare([predict_ms(table, layout, w) for w in widths], measured)
