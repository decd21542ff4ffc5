"""DARTS-style search spaces (DP-FNAS): architecture variables, a mixed forward, a derivation.

The extension of the search-space API that DP-FNAS searches (DARTS, Liu et al., 2019): a
``SearchSpace`` whose architecture variables A are parameters of the space and whose
``forward(x)`` *without* an ``arch`` is the continuous relaxation (every searchable
choice mixed by ``softmax(A)``), so one forward is differentiable in the weights W and in
A.  Besides ``SearchSpace`` it has

``arch_keys`` (property)
    the ``state_dict`` keys of A, each an ``nn.Parameter``; every other parameter is a
    weight (:func:`weight_keys`);
``genotype()``
    the architecture derived from the current A: any object with ``to_text()`` (the
    text travels in a ``ConfigRecord``);
``derived_network(genotype, **spec)`` (classmethod)
    the stand-alone network of a genotype's text, built from the space's ``spec`` (minus
    ``name``): what is trained with FedAvg after the search.

DP-FNAS differentiates the mixed forward per sample, so the space must also pass
its per-sample-gradient check (``methods/dpfnas/per_sample.py``): no layer may mix
the samples of a batch (BatchNorm), as opacus' ``ModuleValidator`` says.
``DartsSpace`` is the built-in.

:func:`mixed_flops` and :func:`network_flops` give the per-sample forward FLOPs the
methods' clients book as training compute (``costs.training_flops``): the mixed forward
(every edge runs every op, weighted by ``softmax(A)``) during the search, the derived
network after it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from ..protocol import space_from_config
from .base import SearchSpace, _count_flops, class_path, space_class

__all__ = [
    "DARTS_STYLE_API",
    "DartsStyle",
    "build_derived_network",
    "derived_network_of",
    "mixed_flops",
    "network_flops",
    "require_darts_style",
    "weight_keys",
]

DARTS_STYLE_API = ("arch_keys", "genotype", "derived_network")
"""What DP-FNAS uses besides ``SearchSpace`` and the mixed ``forward(x)``."""


@runtime_checkable
class DartsStyle(Protocol):
    """The DARTS-style API (see the module docstring); ``DartsSpace`` implements it."""

    @property
    def arch_keys(self) -> tuple[str, ...]: ...

    def genotype(self) -> Any: ...

    @classmethod
    def derived_network(cls, genotype: str, **spec: Any) -> nn.Module: ...


def require_darts_style(space: Any, method: str = "DP-FNAS") -> None:
    """Raise ``ValueError`` naming what ``space`` lacks to be searched by ``method``: a
    ``SearchSpace``, the members of :data:`DARTS_STYLE_API`, or ``arch_keys`` naming
    parameters of the space (neither none nor all of them)."""
    how = "see 'A space of your own' in docs/dpfnas.md"
    if not isinstance(space, SearchSpace):
        raise ValueError(f"{method} needs a SearchSpace, got {type(space).__name__}; {how}")
    name = class_path(type(space))
    missing = [
        m
        for m in DARTS_STYLE_API
        if not hasattr(space, m) or (m != "arch_keys" and not callable(getattr(space, m)))
    ]
    if missing:
        raise ValueError(
            f"{method} needs a DARTS-style search space; {name} lacks {', '.join(missing)}: {how}"
        )
    keys = tuple(space.arch_keys)
    parameters = dict(space.named_parameters())
    unknown = [k for k in keys if k not in parameters]
    if not keys or unknown:
        raise ValueError(
            f"{method}: {name}.arch_keys must name parameters of the space (its architecture "
            f"variables), got {list(keys)}" + (f"; not parameters: {unknown}" if unknown else "")
        )
    if not weight_keys(space):
        raise ValueError(f"{method}: every parameter of {name} is in arch_keys; no weights left")


def weight_keys(space: DartsStyle | SearchSpace) -> tuple[str, ...]:
    """Names of the weights W: every parameter of ``space`` not in its ``arch_keys``."""
    arch = set(space.arch_keys)  # type: ignore[union-attr]
    return tuple(k for k, _ in space.named_parameters() if k not in arch)  # type: ignore[union-attr]


def build_derived_network(spec: Mapping[str, Any], genotype: str) -> nn.Module:
    """The derived network of ``genotype`` (its text) for the space ``spec`` describes
    (``spec["name"]``: a registered name or an import path), without building the space."""
    cls = space_class(str(spec["name"]))
    if not callable(getattr(cls, "derived_network", None)):
        raise ValueError(f"{class_path(cls)} has no derived_network: not a DARTS-style space")
    return cls.derived_network(genotype, **{k: v for k, v in spec.items() if k != "name"})


def derived_network_of(config: Mapping[str, Any], state: Mapping[str, Any]) -> nn.Module:
    """The derived network a message describes, loaded with ``state``: its ``genotype``
    (text) for the space of its ``space.<kwarg>`` entries (``protocol.space_from_config``).
    The client side of every method that trains a derived network with FedAvg."""
    net = build_derived_network(space_from_config(config), str(config["genotype"]))
    net.load_state_dict(state)
    return net


def network_flops(net: nn.Module, space: SearchSpace) -> int:
    """Forward FLOPs of one sample at ``space``'s input shape and dtype through ``net``
    (``FlopCounterMode``, the cost tables' convention: 2 x MACs of matmuls and
    convolutions), counted in eval mode without gradients; ``net``'s mode is kept."""
    was_training = net.training
    net.eval()  # batch-1 BatchNorm in train mode may fail and would move running stats
    device = next((p.device for p in net.parameters()), torch.device("cpu"))
    x = torch.zeros((1, *space.input_shape), dtype=space.input_dtype, device=device)
    try:
        with torch.no_grad():
            return _count_flops(net, x)
    finally:
        net.train(was_training)


def mixed_flops(space: SearchSpace) -> int:
    """Forward FLOPs of one sample through ``space``'s mixed forward ``space(x)``: every
    searchable choice computed and mixed by ``softmax(A)`` (a DARTS edge runs all of its
    ops), the per-sample cost of a search step's forward."""
    return network_flops(space, space)
