"""Prunable nets for DecNAS (federated NetAdapt): any ``nn.Module`` of conv/linear layers.

A :class:`PrunableNet` wraps a model (``.model``) built from its class and keyword
arguments, and describes it by its *widths*: the number of filters of each prunable
layer (its architecture).  ``build_prunable(MyNet, num_classes=10)`` wraps a user's
class (clients import it back by its path, ``"mypkg.nets:MyNet"``);
``build_prunable("convnet" | "mobilenet", ...)`` one of the built-ins
(:mod:`.prunable_nets`); ``build_prunable(**net.spec)`` rebuilds a structure and
``load_prunable(spec, state_dict)`` a structure holding given weights.

The prunable layers come from torch-pruning's dependency graph, traced on one sample of
``input_shape``: one layer per group of coupled channels rooted at a conv/linear layer,
named by its first conv/linear layer (in module order) that is not depthwise; a group
that reaches the model's output (the classifier) is not prunable.  What follows a
layer's filters (BN, the next layers' input channels, depthwise partners, flattened
classifier columns, residual or concatenated branches) is sliced by torch-pruning.

:func:`prune_layer` keeps a layer's largest-L2-norm filters.  Costs come from the shared
cost layer (:class:`~.base.Cost`, measured with ``FlopCounterMode`` on one sample:
FLOPs = 2 x MACs) on a storage-free copy (meta device), memoised per spec.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch_pruning as tp
from torch import Tensor, nn

from . import prunable_graph as graph
from . import prunable_spec as specs
from .base import Cost, _count_flops, _num_params
from .prunable_graph import Layout
from .prunable_nets import PRUNABLE_NETS, ConvNet, MobileNetV1

__all__ = [
    "PRUNABLE_NETS",
    "RESOURCES",
    "ConvNet",
    "MobileNetV1",
    "PrunableNet",
    "build_prunable",
    "filter_norms",
    "load_prunable",
    "meta_prunable",
    "prune_layer",
    "prune_to_budget",
    "resource",
    "spec_cost",
    "width_scaled",
]

RESOURCES = ("macs", "params")
"""What a budget may count: multiply-accumulates of one sample, or parameters."""

_COSTS: dict[tuple[Any, ...], Cost] = {}
_COSTS_LIMIT = 4096
_TWINS: dict[tuple[Any, ...], tuple[tp.DependencyGraph, dict[nn.Module, str]]] = {}


class PrunableNet(nn.Module):
    """A model whose prunable layers have ``widths`` filters; ``forward`` is the model's.

    Built by :func:`build_prunable`, never directly.  ``state_dict`` keys are the model's
    under ``model.``; ``spec`` (model name or import path, its keyword arguments,
    ``input_shape`` and ``widths``) rebuilds the structure on a client.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        name: str,
        kwargs: Mapping[str, Any],
        input_shape: Sequence[int],
        layout: Layout,
        widths: Sequence[int],
    ) -> None:
        super().__init__()
        self.model = model
        self.name = name
        self.kwargs = dict(kwargs)
        self.input_shape = tuple(input_shape)
        self.layout = layout
        self.widths = tuple(int(w) for w in widths)

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x)

    @property
    def spec(self) -> dict[str, Any]:
        """``build_prunable(**spec)`` rebuilds this structure (weights not included)."""
        return {
            "name": self.name,
            **self.kwargs,
            "input_shape": list(self.input_shape),
            "widths": list(self.widths),
        }

    @property
    def num_layers(self) -> int:
        """K: the number of prunable layers."""
        return len(self.widths)

    def layer_names(self) -> tuple[str, ...]:
        """The module name of each prunable layer (in the model, without ``model.``)."""
        return self.layout.layers

    def cost(self) -> Cost:
        """FLOPs (2 x MACs, one sample, ``FlopCounterMode``) and parameters, memoised per spec."""
        key = _spec_key(self.spec)
        cost = _COSTS.get(key)
        if cost is None:
            probe = self if _is_meta(self) else _on_meta(self.spec)
            training = probe.training
            probe.eval()
            x = torch.zeros((1, *self.input_shape), device=_device_of(probe.model))
            with torch.no_grad():
                cost = Cost(_count_flops(probe, x), _num_params(probe))
            probe.train(training)
            _remember(_COSTS, key, cost)
        return cost

    def extra_repr(self) -> str:
        return f"name={self.name!r}, widths={list(self.widths)}"


def build_prunable(
    name: str | type[nn.Module],
    *,
    input_shape: Sequence[int] | None = None,
    widths: Sequence[int] | None = None,
    **kwargs: Any,
) -> PrunableNet:
    """``name(**kwargs)`` as a :class:`PrunableNet`, freshly initialised (current RNG).

    Parameters
    ----------
    name : str or nn.Module subclass
        A built-in (``"convnet"``, ``"mobilenet"``), the import path of an ``nn.Module``
        class (``"mypkg.nets:MyNet"``) or the class itself, defined at the top level of
        an importable module: clients import it back by its path.
    input_shape : sequence of int, optional
        One sample's shape, e.g. ``(3, 32, 32)``; by default ``(in_channels,
        input_height, input_width)`` from ``kwargs`` (as the built-ins take).
    widths : sequence of int, optional
        Filters per prunable layer, each at most the model's own; the last filters of
        each layer go and every module that lost channels is initialised again by its
        ``reset_parameters()``.  Default: the model's own.
    **kwargs
        The model's constructor arguments: numbers, strings, bytes or lists of one of
        those (they travel in Flower's ``ConfigRecord``).

    Raises
    ------
    ValueError
        An unknown name or argument, a model torch-pruning cannot trace, one with no
        prunable layer, or bad ``widths``.
    """
    name, cls = specs.model_class(name)
    kwargs = specs.model_kwargs(name, cls, kwargs)
    shape = specs.input_shape(input_shape, kwargs)
    return _build(name, cls, kwargs, shape, widths, fresh=True)


def load_prunable(spec: Mapping[str, Any], state_dict: Mapping[str, Tensor]) -> PrunableNet:
    """The structure ``spec`` holding ``state_dict`` (strict), without initialising
    weights first: built on the meta device, then given storage and loaded."""
    net = _on_meta(spec)
    persistent = set(net.state_dict())
    if any(f"model.{k}" not in persistent for k, _ in net.model.named_buffers()):
        net = build_prunable(**spec)  # non-persistent buffers need the constructor's values
    else:
        net = net.to_empty(device="cpu")
    net.load_state_dict(state_dict, strict=True)
    return net


def meta_prunable(spec: Mapping[str, Any]) -> PrunableNet:
    """The structure ``spec`` without storage (meta device): shapes, no weights."""
    return _on_meta(spec)


def spec_cost(spec: Mapping[str, Any]) -> Cost:
    """The cost of ``build_prunable(**spec)``, without building its weights."""
    cost = _COSTS.get(_spec_key(spec))
    return cost if cost is not None else _on_meta(spec).cost()


def resource(net: PrunableNet | Mapping[str, Any], kind: str) -> int:
    """``"macs"`` (FLOPs / 2 of one sample) or ``"params"`` of a net or of its spec."""
    cost = net.cost() if isinstance(net, PrunableNet) else spec_cost(net)
    if kind == "macs":
        return cost.flops // 2
    if kind == "params":
        return cost.params
    raise ValueError(f"unknown resource {kind!r}; valid: {', '.join(RESOURCES)}")


def filter_norms(net: PrunableNet, layer: int) -> Tensor:
    """L2 norm of every filter of ``layer`` (NetAdapt / DecNAS §4.1 rank filters by it);
    a filter shared by coupled layers (added branches) counts all their weights."""
    layer = _check_layer(net, layer)
    modules = [net.model.get_submodule(path) for path in net.layout.filters[layer]]
    norms = [graph.filters(module).norm(dim=1) for module in modules]
    return norms[0] if len(norms) == 1 else torch.stack(norms).norm(dim=0)


def prune_layer(net: PrunableNet, layer: int, keep: int) -> PrunableNet:
    """A copy of ``net`` whose ``layer`` keeps its ``keep`` largest-norm filters (in their
    original order); torch-pruning slices whatever depends on them."""
    layer = _check_layer(net, layer)
    filters = net.widths[layer]
    if not 1 <= keep <= filters:
        raise ValueError(f"layer {layer} has {filters} filters; cannot keep {keep}")
    norms = filter_norms(net, layer)
    kept = set(torch.argsort(norms, descending=True, stable=True)[:keep].tolist())
    dropped = [i for i in range(filters) if i not in kept]
    model = copy.deepcopy(net.model)
    if dropped:  # planned on a storage-free twin: no forward on the real weights
        traced, names = _twin(net)
        graph.apply(graph.layer_plan(traced, names, net.layout.layers[layer], dropped), model)
    pruned = PrunableNet(
        model,
        name=net.name,
        kwargs=net.kwargs,
        input_shape=net.input_shape,
        layout=net.layout,
        widths=_replaced(net.widths, layer, keep),
    )
    return pruned.train(net.training)


def prune_to_budget(
    net: PrunableNet,
    layer: int,
    budget: float,
    kind: str = "macs",
    min_filters: int = 1,
    *,
    cost: Callable[[Sequence[int]], float] | None = None,
) -> PrunableNet | None:
    """Prune the fewest filters of ``layer`` so that ``resource(pruned, kind) <= budget``;
    ``None`` if even ``min_filters`` filters exceed it.

    ``cost`` (widths -> a number, e.g. a latency table's prediction) replaces
    ``resource(..., kind)``: the most filters from ``min_filters`` up whose cost meets the
    budget, found by scanning every width (a table's prediction need not be linear).

    For nets whose resource is linear in one layer's width (no two pruned layers feed
    one another) the number to remove is ``ceil((Res(net) - budget) / (Res(net) -
    Res(net with one filter less)))``; the measured cost is checked and more filters go
    while it exceeds the budget.
    """
    layer = _check_layer(net, layer)
    if cost is not None:
        fits = [
            keep
            for keep in range(net.widths[layer], min_filters - 1, -1)
            if cost(_replaced(net.widths, layer, keep)) <= budget
        ]
        return prune_layer(net, layer, fits[0]) if fits else None
    current, filters = resource(net, kind), net.widths[layer]
    if current <= budget:
        return prune_layer(net, layer, filters)
    if filters <= min_filters:
        return None
    step = current - resource(_respec(net, _replaced(net.widths, layer, filters - 1)), kind)
    if step <= 0:
        return None
    keep = filters - math.ceil((current - budget) / step)
    if keep < min_filters:
        return None
    while resource(_respec(net, _replaced(net.widths, layer, keep)), kind) > budget:
        if keep <= min_filters:
            return None
        keep -= 1
    return prune_layer(net, layer, keep)


def width_scaled(
    net: PrunableNet,
    budget: float,
    kind: str = "macs",
    *,
    cost: Callable[[Sequence[int]], float] | None = None,
) -> PrunableNet:
    """The width-multiplier baseline: every layer of ``net``'s structure scaled by one
    factor, the largest (to 1e-3) whose resource (or ``cost`` of the widths) fits
    ``budget``; fresh weights."""
    low, high = 0.0, 1.0
    for _ in range(12):
        middle = (low + high) / 2
        widths = [max(1, round(w * middle)) for w in net.widths]
        spent = cost(widths) if cost is not None else resource(_respec(net, widths), kind)
        if spent <= budget:
            low = middle
        else:
            high = middle
    widths = [max(1, round(w * low)) for w in net.widths]
    return build_prunable(**_respec(net, widths))


# --- building --------------------------------------------------------------------------


def _build(
    name: str,
    cls: type[nn.Module],
    kwargs: dict[str, Any],
    shape: tuple[int, ...],
    widths: Sequence[int] | None,
    *,
    fresh: bool,
) -> PrunableNet:
    """``fresh``: newly initialised weights (the caller's RNG draws them as ``cls(**kwargs)``
    would); else the traced twin's copy (storage-free)."""
    model = _construct(name, cls, kwargs) if fresh else None
    with torch.random.fork_rng(devices=[]):  # tracing the base draws nothing from the caller's RNG
        base = graph.base_of(
            (name, shape, specs.frozen(kwargs)), lambda: _construct(name, cls, kwargs), shape
        )
    wanted = _check_widths(name, base.layout, widths)
    if model is None:
        model = copy.deepcopy(base.model)
    plan = graph.tail_plan(base, wanted)
    graph.apply(plan, model)  # which filters go does not matter: weights are loaded or fresh
    if fresh:  # initialised for their new fan-in, as a model built at these widths would be
        for path in dict.fromkeys(path for path, _, _ in plan):
            reset = getattr(model.get_submodule(path), "reset_parameters", None)
            if callable(reset):
                reset()
    return PrunableNet(
        model, name=name, kwargs=kwargs, input_shape=shape, layout=base.layout, widths=wanted
    )


def _on_meta(spec: Mapping[str, Any]) -> PrunableNet:
    """The structure of ``spec`` without storage (for costs and as a loading target)."""
    values = dict(spec)
    name, cls = specs.model_class(values.pop("name"))
    shape, widths = values.pop("input_shape", None), values.pop("widths", None)
    kwargs = specs.model_kwargs(name, cls, values)
    return _build(name, cls, kwargs, specs.input_shape(shape, kwargs), widths, fresh=False)


def _twin(net: PrunableNet) -> tuple[tp.DependencyGraph, dict[nn.Module, str]]:
    """The dependency graph of ``net``'s structure (traced storage-free, memoised)."""
    key = _spec_key(net.spec)
    found = _TWINS.get(key)
    if found is None:
        model = _on_meta(net.spec).model
        found = (graph.trace(model, net.input_shape, net.name), graph.names_of(model))
        _TWINS.clear()  # the latest only: prune_to_budget visits every layer of one net
        _TWINS[key] = found
    return found


def _respec(net: PrunableNet, widths: Sequence[int]) -> dict[str, Any]:
    """``net``'s spec with other widths (a spec's cost is memoised before it is built)."""
    return {**net.spec, "widths": list(widths)}


def _construct(name: str, cls: type[nn.Module], kwargs: dict[str, Any]) -> nn.Module:
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:
        raise ValueError(f"prunable net {name!r} cannot be built from {kwargs}: {err}") from err


# --- checking --------------------------------------------------------------------------


def _check_widths(name: str, layout: Layout, widths: Sequence[int] | None) -> tuple[int, ...]:
    if widths is None:
        return layout.base_widths
    values = tuple(widths)
    if len(values) != len(layout.base_widths) or not all(
        isinstance(w, int | np.integer) and not isinstance(w, bool) and 1 <= w <= base
        for w, base in zip(values, layout.base_widths, strict=False)
    ):
        raise ValueError(
            f"{name} needs {len(layout.base_widths)} widths (filters per prunable layer), "
            f"each an integer from 1 to the model's own {list(layout.base_widths)}; got {values}"
        )
    return tuple(int(w) for w in values)


def _check_layer(net: PrunableNet, layer: int) -> int:
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < net.num_layers:
        raise ValueError(f"{net.name} has prunable layers 0..{net.num_layers - 1}; got {layer!r}")
    return layer


# --- helpers ---------------------------------------------------------------------------


def _replaced(widths: Sequence[int], layer: int, width: int) -> list[int]:
    return [width if i == layer else w for i, w in enumerate(widths)]


def _spec_key(spec: Mapping[str, Any]) -> tuple[Any, ...]:
    return specs.frozen(spec)


def _remember(memo: dict[Any, Any], key: Any, value: Any) -> None:
    if len(memo) >= _COSTS_LIMIT:
        memo.pop(next(iter(memo)))
    memo[key] = value


def _device_of(model: nn.Module) -> torch.device:
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return torch.device("cpu")


def _is_meta(net: nn.Module) -> bool:
    return _device_of(net).type == "meta"
