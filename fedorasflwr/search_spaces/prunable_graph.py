"""torch-pruning's dependency graph as DecNAS uses it: prunable layers and pruning plans.

A model is traced once per class and arguments (:func:`base_of`), storage-free on the
meta device when its ``forward`` allows (else on the CPU).  Its :class:`Layout` lists
the prunable layers; a *plan* says which channels each module loses, by module name, so
that one plan computed on a traced twin prunes any model of the same structure without
tracing it (:func:`apply`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch_pruning as tp
from torch import Tensor, nn

__all__ = [
    "Base",
    "Layout",
    "Plan",
    "apply",
    "base_of",
    "filters",
    "layer_plan",
    "names_of",
    "tail_plan",
    "trace",
]

FILTER_LAYERS = (nn.modules.conv._ConvNd, nn.Linear)
"""The layers whose output channels (filters) make a prunable layer."""

Plan = dict[tuple[str, Callable[..., Any], int], set[int]]
"""(module name, torch-pruning handler, pruning dim) -> channel indices it loses."""

_BASES: dict[tuple[Any, ...], Base] = {}
_BASES_LIMIT = 16


@dataclass(frozen=True)
class Layout:
    """Where a model's prunable layers are (found once per model class and arguments).

    ``layers[i]`` names layer i's module; ``filters[i]`` every conv/linear module whose
    filters are layer i's (more than one when branches are added); ``base_widths[i]``
    its filters in the unpruned model."""

    layers: tuple[str, ...]
    filters: tuple[tuple[str, ...], ...]
    base_widths: tuple[int, ...]


@dataclass(frozen=True)
class Base:
    """An unpruned model (never modified), its dependency graph and its layout."""

    model: nn.Module
    graph: tp.DependencyGraph
    layout: Layout
    names: dict[nn.Module, str]


def base_of(key: tuple[Any, ...], build: Callable[[], nn.Module], shape: Sequence[int]) -> Base:
    """The traced unpruned model ``build()`` (memoised per ``key``): on the meta device,
    or on the CPU when its construction or ``forward`` fails there."""
    base = _BASES.get(key)
    if base is None:
        name = str(key[0])
        try:
            with torch.device("meta"):
                model = build()
            graph = trace(model, shape, name)
        except Exception:  # a forward that needs data (data-dependent shapes): trace on the CPU
            model = build()
            graph = trace(model, shape, name)
        base = Base(model, graph, find_layout(model, graph, name), names_of(model))
        if len(_BASES) >= _BASES_LIMIT:
            _BASES.pop(next(iter(_BASES)))
        _BASES[key] = base
    return base


def trace(model: nn.Module, shape: Sequence[int], name: str) -> tp.DependencyGraph:
    """torch-pruning's dependency graph of ``model``, traced on one zero sample."""
    device = next((t.device for t in (*model.parameters(), *model.buffers())), None)
    x = torch.zeros((1, *shape), device=device)
    training = model.training
    try:
        with torch.enable_grad():
            graph = tp.DependencyGraph().build_dependency(model, x, verbose=False)
    except Exception as err:  # a user's forward may fail in any way on the traced input
        raise ValueError(
            f"torch-pruning cannot trace prunable net {name!r} on an input of shape "
            f"{(1, *shape)}: {type(err).__name__}: {err}"
        ) from err
    finally:
        model.train(training)
    if graph.unwrapped_parameters:
        held = sorted(graph._param_to_name[p] for p, _ in graph.unwrapped_parameters)
        raise ValueError(
            f"prunable net {name!r} holds parameters outside conv/linear/norm layers "
            f"({', '.join(held)}): torch-pruning cannot tell which of their dimensions "
            "follow a layer's filters"
        )
    return graph


def find_layout(model: nn.Module, graph: tp.DependencyGraph, name: str) -> Layout:
    """One prunable layer per channel group rooted at a conv/linear layer, in module
    order, named by its first conv/linear layer that is not depthwise; a group whose
    channels reach the output (the classifier's) is left whole."""
    names = names_of(model)
    order = {module: index for index, module in enumerate(names)}
    grouped = [
        path
        for module, path in names.items()
        if isinstance(module, nn.modules.conv._ConvNd) and 1 < module.groups < module.out_channels
    ]
    if grouped:
        raise ValueError(
            f"prunable net {name!r}: grouped convolutions ({', '.join(grouped)}) are not "
            "supported; use groups=1 or depthwise convolutions"
        )
    final = _output_layers(graph)
    found = []
    for group in graph.get_all_groups(root_module_types=FILTER_LAYERS):
        coupled = [
            dep.target.module
            for dep, _ in group
            if graph.is_out_channel_pruning_fn(dep.handler)
            and isinstance(dep.target.module, FILTER_LAYERS)
        ]
        owners = sorted((m for m in coupled if not _depthwise(m)), key=order.__getitem__)
        if not owners or any(m in final for m in coupled):
            continue
        found.append((order[owners[0]], tuple(names[m] for m in owners), _out(owners[0])))
    if not found:
        raise ValueError(
            f"prunable net {name!r} has no prunable layer: no conv/linear layer whose "
            "filters are not the model's output"
        )
    found.sort()
    return Layout(
        layers=tuple(paths[0] for _, paths, _ in found),
        filters=tuple(paths for _, paths, _ in found),
        base_widths=tuple(width for _, _, width in found),
    )


def tail_plan(base: Base, widths: Sequence[int]) -> Plan:
    """The plan that leaves each layer of ``base`` its first ``widths[i]`` filters (with
    every index in ``base``'s coordinates, so that the groups' plans merge)."""
    plan: Plan = {}
    for path, full, width in zip(base.layout.layers, base.layout.base_widths, widths, strict=True):
        if width < full:
            module = base.model.get_submodule(path)
            _merge(plan, _group(base.graph, module, range(width, full)), base.names)
    return plan


def layer_plan(
    graph: tp.DependencyGraph, names: Mapping[nn.Module, str], layer: str, drop: Iterable[int]
) -> Plan:
    """The plan removing filters ``drop`` of module ``layer`` (``graph``'s coordinates)."""
    plan: Plan = {}
    module = next(m for m, path in names.items() if path == layer)
    _merge(plan, _group(graph, module, drop), names)
    return plan


def apply(plan: Plan, model: nn.Module) -> nn.Module:
    """Prune ``model`` in place as ``plan`` says; returns it."""
    for (path, handler, dim), indices in plan.items():
        handler.__self__.pruning_dim = dim
        handler(model.get_submodule(path), sorted(indices))
    return model


def filters(module: nn.Module) -> Tensor:
    """One row per filter (output channel) of a conv/linear layer's weight."""
    weight = module.weight.detach()
    if getattr(module, "transposed", False):
        weight = weight.transpose(0, 1)
    return weight.flatten(1)


def _merge(plan: Plan, group: Any, names: Mapping[nn.Module, str]) -> None:
    """Add a torch-pruning group's items to ``plan``; element-wise, reshape and concat
    nodes hold nothing to slice."""
    for dep, indices in group:
        if isinstance(dep.target.module, nn.Module) and dep.target.module in names:
            key = (names[dep.target.module], dep.handler, dep.target.pruning_dim)
            plan.setdefault(key, set()).update(int(i) for i in indices)


def _group(graph: tp.DependencyGraph, module: nn.Module, indices: Iterable[int]) -> Any:
    pruner = graph.get_pruner_of_module(module)
    return graph.get_pruning_group(module, pruner.prune_out_channels, list(indices))


def _output_layers(graph: tp.DependencyGraph) -> set[nn.Module]:
    """The conv/linear layers whose channels are the output's (through shape-keeping ops)."""
    stack = [node for node in graph.module2node.values() if not node.outputs]  # the outputs
    seen, final = set(), set()
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if isinstance(node.module, FILTER_LAYERS):
            final.add(node.module)
        else:
            stack.extend(node.inputs)
    return final


def names_of(model: nn.Module) -> dict[nn.Module, str]:
    return {module: path for path, module in model.named_modules()}


def _depthwise(module: nn.Module) -> bool:
    return isinstance(module, nn.modules.conv._ConvNd) and module.groups > 1


def _out(module: nn.Module) -> int:
    return module.out_features if isinstance(module, nn.Linear) else module.out_channels
