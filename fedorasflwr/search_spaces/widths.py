"""Width-scaled sub-models of one fixed architecture, and their slice-wise aggregation.

The width-scaling baselines (HeteroFL, Diao et al., 2021; FjORD, Horvath et al., 2021)
widen a fixed architecture instead of searching one: a client of width ``p`` trains the
sub-model whose every hidden layer keeps its leading ``round(p * channels)`` channels
(at least 1); the input channels and the classes stay whole.  The architecture here is
DecNAS's ``ConvNet`` (:mod:`.prunable_nets`: six 3x3 CONV-BN-ReLU layers, a max-pool
after every second, one FC layer), whose ``width`` argument already builds exactly that
sub-model: the classifier's input is the channel-major flatten of the last feature map,
so its leading columns are the leading channels' features.

Every tensor of the sub-model is therefore the *leading corner* of the full model's
tensor of the same name (``global[name][:s0, :s1, ...]`` for the sub-model's shape
``(s0, s1, ...)``): :func:`sub_arrays` cuts it, :func:`aggregate_slices` puts
clients' corners back, averaging each entry over the clients that hold it.

BatchNorm: the nets keep running statistics, which the aggregate carries but nobody
trusts: they are re-estimated for the weights before any evaluation (``training.
held_out_metrics`` with calibration data, ``runs.GlobalTest.score``).  This stands in for
HeteroFL's sBN (statistics not tracked in training, computed once for the final model).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from ..costs import flops_to_macs
from .base import _count_flops, _num_params, positive_float
from .prunable_nets import ConvNet

__all__ = [
    "WidthUpdate",
    "aggregate_slices",
    "parse_widths",
    "sub_arrays",
    "width_costs",
    "width_net",
    "width_shapes",
]

#: one client's reply: its arrays (a leading corner of every global array), its width,
#: and the examples it trained on (the aggregation weight)
WidthUpdate = tuple[Mapping[str, np.ndarray], float, int]


def width_net(image: Mapping[str, int], width: float = 1.0) -> nn.Module:
    """The fixed architecture at ``width`` (0 < width <= 1) for ``image`` (``num_classes``,
    ``in_channels``, ``input_height``, ``input_width``): its hidden layers keep their
    leading ``round(width * channels)`` channels, at least 1."""
    if not 0 < positive_float("width", width) <= 1:
        raise ValueError(f"width must be in (0, 1], got {width!r}")
    return ConvNet(
        num_classes=image["num_classes"],
        in_channels=image["in_channels"],
        input_height=image["input_height"],
        input_width=image["input_width"],
        width=width,
    )


def width_shapes(image: Mapping[str, int], width: float) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape in the sub-model at ``width`` (state-dict names)."""
    return {k: tuple(v.shape) for k, v in width_net(image, width).state_dict().items()}


def sub_arrays(
    arrays: Mapping[str, np.ndarray], shapes: Mapping[str, Sequence[int]]
) -> dict[str, np.ndarray]:
    """The leading corner of each of ``arrays`` of the shape ``shapes`` names (copies)."""
    if set(shapes) != set(arrays):
        raise ValueError(
            f"sub-model names differ from the model's: {sorted(set(shapes) ^ set(arrays))}"
        )
    out = {}
    for name, shape in shapes.items():
        full = np.asarray(arrays[name])
        _check_corner(name, tuple(shape), full.shape)
        out[name] = np.array(full[tuple(slice(0, s) for s in shape)])
    return out


def _check_corner(name: str, shape: tuple[int, ...], full: tuple[int, ...]) -> None:
    if len(shape) != len(full) or any(s > f for s, f in zip(shape, full, strict=True)):
        raise ValueError(f"{name!r}: shape {shape} is not a leading corner of {full}")


def aggregate_slices(
    global_arrays: Mapping[str, np.ndarray], updates: Sequence[WidthUpdate]
) -> dict[str, np.ndarray]:
    """Average each entry of ``global_arrays`` over the clients whose slice holds it.

    Parameters
    ----------
    global_arrays : mapping of name -> array
        The full-width model (not modified).
    updates : sequence of (arrays, width, num_examples)
        Each client's arrays, every one a leading corner of the global array of its
        name (all names present), weighted by ``num_examples`` (> 0).  The width is
        that of the sub-model the arrays come from (checked: 0 < width <= 1).

    Returns
    -------
    dict of name -> array
        Entry ``i`` of each array: the example-weighted mean of the clients' values at
        ``i`` over the clients whose corner contains ``i`` (HeteroFL's Eq. 3, FjORD's
        per-slice FedAvg); an entry no client holds keeps its global value.  The dtype
        of each global array is kept.
    """
    sums = {k: np.zeros(np.shape(v), dtype=np.float64) for k, v in global_arrays.items()}
    weights = {k: np.zeros(np.shape(v), dtype=np.float64) for k, v in global_arrays.items()}
    for arrays, width, examples in updates:
        if not 0 < width <= 1:
            raise ValueError(f"an update's width must be in (0, 1], got {width!r}")
        if examples <= 0:
            raise ValueError(f"an update's num_examples must be > 0, got {examples!r}")
        if set(arrays) != set(global_arrays):
            raise ValueError(
                f"an update's names differ from the model's: "
                f"{sorted(set(arrays) ^ set(global_arrays))}"
            )
        for name, value in arrays.items():
            value = np.asarray(value, dtype=np.float64)
            _check_corner(name, value.shape, sums[name].shape)
            corner = tuple(slice(0, s) for s in value.shape)
            sums[name][corner] += examples * value
            weights[name][corner] += examples
    out = {}
    for name, value in global_arrays.items():
        value = np.asarray(value)
        held = weights[name] > 0
        mean = np.where(held, sums[name] / np.where(held, weights[name], 1.0), value)
        out[name] = mean.astype(value.dtype)
    return out


def width_costs(image: Mapping[str, int], width: float) -> dict[str, Any]:
    """The sub-model at ``width``: its forward FLOPs and MACs for one sample and its
    parameter count (``width``, ``flops``, ``macs``, ``params``)."""
    net = width_net(image, width).eval()
    sample = torch.zeros(1, image["in_channels"], image["input_height"], image["input_width"])
    with torch.no_grad():
        flops = _count_flops(net, sample)
    return {
        "width": width,
        "flops": flops,
        "macs": flops_to_macs(flops),
        "params": _num_params(net),
    }


def parse_widths(text: str, key: str) -> tuple[float, ...]:
    """A comma-separated ladder of widths (run config ``key``), each in (0, 1], strictly
    increasing: "0.25,0.5,1.0" -> (0.25, 0.5, 1.0).  A bad value raises ``ValueError``
    naming ``key``, the value and what is allowed."""
    allowed = "comma-separated widths in (0, 1], strictly increasing, e.g. '0.25,0.5,1.0'"
    try:
        widths = tuple(float(part) for part in str(text).split(","))
    except ValueError:
        raise ValueError(f"run config {key!r} = {text!r}: allowed: {allowed}") from None
    ok = all(0 < w <= 1 for w in widths) and all(
        a < b for a, b in zip(widths, widths[1:], strict=False)
    )
    if not widths or not ok:
        raise ValueError(f"run config {key!r} = {text!r}: allowed: {allowed}")
    return widths
