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
clients' corners back, combining each entry over the clients that hold it.

Any other model whose width-``p`` version has that property serves as well: a factory
``model_fn(width) -> nn.Module`` (:func:`width_model_shapes` checks the property,
:func:`model_costs` measures each width).

BatchNorm: the nets keep running statistics, which the aggregate carries but nobody
trusts: they are re-estimated for the weights before any evaluation (``training.
held_out_metrics`` with calibration data, ``runs.GlobalTest.score``).  This stands in for
HeteroFL's sBN (statistics not tracked in training, computed once for the final model).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from ..costs import flops_to_macs
from ..federation.aggregation import MEAN, Aggregation
from .base import _count_flops, _num_params, positive_float
from .prunable_nets import ConvNet

__all__ = [
    "ModelFn",
    "WidthUpdate",
    "aggregate_slices",
    "model_costs",
    "parse_widths",
    "sub_arrays",
    "width_costs",
    "width_model_shapes",
    "width_net",
    "width_shapes",
]

#: a width-scalable model: ``model_fn(width)`` builds it at ``width`` (0 < width <= 1)
ModelFn = Callable[[float], nn.Module]

#: one client's reply: its arrays (a leading corner of every global array), its width,
#: and the examples it trained on (the aggregation weight)
WidthUpdate = tuple[Mapping[str, np.ndarray], float, int]


def width_net(image: Mapping[str, int], width: float = 1.0, head: str = "flatten") -> nn.Module:
    """The fixed architecture at ``width`` (0 < width <= 1) for ``image`` (``num_classes``,
    ``in_channels``, ``input_height``, ``input_width``): its hidden layers keep their
    leading ``round(width * channels)`` channels, at least 1.  ``head``: how the
    classifier reads the last map (``prunable_nets.CONVNET_HEADS``)."""
    if not 0 < positive_float("width", width) <= 1:
        raise ValueError(f"width must be in (0, 1], got {width!r}")
    return ConvNet(
        num_classes=image["num_classes"],
        in_channels=image["in_channels"],
        input_height=image["input_height"],
        input_width=image["input_width"],
        width=width,
        head=head,
    )


def width_shapes(image: Mapping[str, int], width: float) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape in the sub-model at ``width`` (state-dict names)."""
    return _shapes(width_net(image, width))


def _shapes(net: nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in net.state_dict().items()}


def _built(model_fn: ModelFn, width: float) -> nn.Module:
    net = model_fn(width)
    if not isinstance(net, nn.Module):
        raise ValueError(f"model_fn({width}) returned a {type(net).__name__}, not an nn.Module")
    return net


def width_model_shapes(
    model_fn: ModelFn, widths: Iterable[float], full: nn.Module | None = None
) -> dict[float, dict[str, tuple[int, ...]]]:
    """Each tensor's shape (state-dict names) in ``model_fn(w)`` for every ``w`` of
    ``widths`` and 1.0, checked to be slices of the full-width model.

    Parameters
    ----------
    model_fn : callable
        ``model_fn(width) -> nn.Module``, ``0 < width <= 1``; ``model_fn(1.0)`` is the
        full model.
    widths : iterable of float
        The widths to check, each in (0, 1].
    full : nn.Module, optional
        ``model_fn(1.0)`` when the caller has built it already.

    Raises
    ------
    ValueError
        A width outside (0, 1], a ``model_fn`` that returns no ``nn.Module``, or a width-w
        model whose tensor names differ from the full model's or one of whose tensors is
        not a leading corner of the full model's tensor of the same name (naming the
        tensor and both shapes): the slice-wise aggregation would mix unrelated entries.
    """
    if full is None:
        full = _built(model_fn, 1.0)
    elif not isinstance(full, nn.Module):
        raise ValueError(f"model_fn(1.0) returned a {type(full).__name__}, not an nn.Module")
    full_shapes = _shapes(full)
    out = {1.0: full_shapes}
    for width in sorted(set(widths) - {1.0}):
        if not 0 < positive_float("width", width) <= 1:
            raise ValueError(f"width must be in (0, 1], got {width!r}")
        shapes = _shapes(_built(model_fn, width))
        if set(shapes) != set(full_shapes):
            raise ValueError(
                f"model_fn({width}) has tensors {sorted(set(shapes) - set(full_shapes))} and "
                f"lacks {sorted(set(full_shapes) - set(shapes))} of model_fn(1.0): every width "
                "must have the full model's tensor names"
            )
        for name, shape in shapes.items():
            whole = full_shapes[name]
            if len(shape) != len(whole) or any(s > f for s, f in zip(shape, whole, strict=True)):
                raise ValueError(
                    f"model_fn({width})'s {name!r} has shape {shape}, not a leading corner of "
                    f"model_fn(1.0)'s {whole}: a width-w model must keep the leading "
                    "channels of every tensor of the full model (the same rank, no dimension "
                    "larger)"
                )
        out[width] = shapes
    return out


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
    global_arrays: Mapping[str, np.ndarray],
    updates: Sequence[WidthUpdate],
    aggregation: Aggregation = MEAN,
) -> dict[str, np.ndarray]:
    """Combine each entry of ``global_arrays`` over the clients whose slice holds it.

    Parameters
    ----------
    global_arrays : mapping of name -> array
        The full-width model (not modified).
    updates : sequence of (arrays, width, num_examples)
        Each client's arrays, every one a leading corner of the global array of its
        name (all names present), weighted by ``num_examples`` (> 0).  The width is
        that of the sub-model the arrays come from (checked: 0 < width <= 1).
    aggregation : Aggregation (default: the example-weighted mean)
        How an entry's values are combined: ``"mean"`` weighted by ``num_examples``; the
        robust ``"median"`` / ``"trimmed-mean"`` unweighted, over the same clients
        (``federation.aggregation.Aggregation``: the run config's ``aggregation``).

    Returns
    -------
    dict of name -> array
        Entry ``i`` of each array: the example-weighted mean of the clients' values at
        ``i`` over the clients whose corner contains ``i`` (HeteroFL's Eq. 3, FjORD's
        per-slice FedAvg), or their median / trimmed mean; an entry no client holds keeps
        its global value.  The dtype of each global array is kept.
    """
    _check_updates(global_arrays, updates)
    if aggregation.robust:
        return {
            name: _robust_entries(np.asarray(value), [a[name] for a, _, _ in updates], aggregation)
            for name, value in global_arrays.items()
        }
    sums = {k: np.zeros(np.shape(v), dtype=np.float64) for k, v in global_arrays.items()}
    weights = {k: np.zeros(np.shape(v), dtype=np.float64) for k, v in global_arrays.items()}
    for arrays, _width, examples in updates:
        for name, value in arrays.items():
            value = np.asarray(value, dtype=np.float64)
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


def _check_updates(global_arrays: Mapping[str, np.ndarray], updates: Sequence[WidthUpdate]) -> None:
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
            _check_corner(name, np.shape(value), np.shape(global_arrays[name]))


def _robust_entries(
    value: np.ndarray, corners: Sequence[np.ndarray], aggregation: Aggregation
) -> np.ndarray:
    """``value`` with each entry held by some of ``corners`` replaced by ``aggregation`` of
    their values there (unweighted); the entries one set of clients holds are combined
    together, the set being which of the distinct corner shapes contain the entry."""
    shapes = sorted({np.shape(c) for c in corners})
    inside = np.zeros((len(shapes), value.size), dtype=bool)
    for j, shape in enumerate(shapes):
        mask = np.zeros(value.shape, dtype=bool)
        mask[tuple(slice(0, s) for s in shape)] = True
        inside[j] = mask.reshape(-1)
    sets, group = np.unique(inside.T, axis=0, return_inverse=True)
    group = group.reshape(-1)
    padded = []
    for corner in corners:
        full = np.zeros(value.shape, dtype=np.float64)
        full[tuple(slice(0, s) for s in np.shape(corner))] = corner
        padded.append((shapes.index(np.shape(corner)), full.reshape(-1)))
    out = np.array(value, copy=True).reshape(-1)
    for index, holders in enumerate(sets):
        if not holders.any():
            continue  # no client holds these entries: they keep their global value
        where = group == index
        held = [full[where] for j, full in padded if holders[j]]
        out[where] = aggregation.combine(held, [1.0] * len(held), value.dtype)
    return out.reshape(value.shape)


def width_costs(image: Mapping[str, int], width: float) -> dict[str, Any]:
    """The sub-model at ``width``: its forward FLOPs and MACs for one sample and its
    parameter count (``width``, ``flops``, ``macs``, ``params``)."""
    shape = (image["in_channels"], image["input_height"], image["input_width"])
    return model_costs(width_net(image, width), width, shape)


def model_costs(
    net: nn.Module,
    width: float,
    input_shape: Sequence[int],
    input_dtype: torch.dtype = torch.float32,
) -> dict[str, Any]:
    """``net`` (a model at ``width``): forward FLOPs (``torch.utils.flop_counter``) and MACs
    (FLOPs / 2) of one zero sample of ``input_shape`` (no batch dimension) and
    ``input_dtype``, in eval mode, and its parameter count (``width``, ``flops``,
    ``macs``, ``params``)."""
    sample = torch.zeros(1, *(int(d) for d in input_shape), dtype=input_dtype)
    was_training = net.training
    net.eval()
    try:
        with torch.no_grad():
            flops = _count_flops(net, sample)
    finally:
        net.train(was_training)
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
