"""Search spaces with architecture parameters per searchable layer (FDNAS / CFDNAS).

The extension of the search-space API that FDNAS and CFDNAS search (ProxylessNAS-style,
Cai et al., ICLR 2019): every searchable layer carries ``alpha``, one logit per option,
as an ``nn.Parameter`` (so it is in ``state_dict`` and travels with the weights).  What
the methods use:

``arch_parameters()``
    the ``alpha`` of every searchable layer, in layer order (shape ``(options,)``);
``weight_parameters()``
    every other parameter (the network weights ``w``);
``probabilities()``
    ``softmax(alpha)`` per layer (differentiable);
``expected_flops()``
    FLOPs of a path drawn from ``softmax(alpha)`` (differentiable in alpha);
``derive(max_flops=None)``
    the derived net: argmax alpha per layer, or the most probable path within
    ``max_flops``;
``forward_gated(x, candidates, gates)``
    each layer runs its ``candidates`` weighted by ``gates`` (binary gates, one active),
    so gradients reach the gates of the candidates that did not run.

:class:`DifferentiableSpace` derives all of them from the base class's choices and cost
tables: a space built from :class:`GatedMixedOp` layers (a ``MixedOp`` plus ``alpha``)
only subclasses it instead of ``SearchSpace``.  Its network passes each searchable layer
its entry of ``arch`` unchanged (as every supernet does), which lets ``forward_gated`` hand
a layer a :class:`GatedChoice` instead of an option index.  :func:`require_differentiable`
is the check both sides of FDNAS run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from .base import MixedOp, SearchSpace, class_path

__all__ = [
    "DIFFERENTIABLE_API",
    "DifferentiableSpace",
    "GatedChoice",
    "GatedMixedOp",
    "most_probable_within",
    "probable_frontier",
    "require_differentiable",
]

DIFFERENTIABLE_API = (
    "arch_parameters",
    "weight_parameters",
    "probabilities",
    "expected_flops",
    "derive",
    "forward_gated",
)
"""The methods FDNAS and CFDNAS call besides ``SearchSpace``'s."""


@dataclass(frozen=True)
class GatedChoice:
    """What a gated forward hands one layer in place of an option index: the options
    to run and their gates (``sum_j gates[j] * op_{candidates[j]}(x)``)."""

    candidates: tuple[int, ...]
    gates: Tensor


class GatedMixedOp(MixedOp):
    """A searchable layer with architecture parameters ``alpha`` (one logit per option).

    ``forward(x, option)`` runs one option (an index), or mixes a :class:`GatedChoice`."""

    def __init__(self, options: Mapping[str, nn.Module]) -> None:
        super().__init__(options)
        self.alpha = nn.Parameter(torch.zeros(len(self.option_names)))

    def forward(self, x: Tensor, option: int | GatedChoice) -> Tensor:
        if isinstance(option, GatedChoice):
            return self.forward_gated(x, option.candidates, option.gates)
        return super().forward(x, option)

    def forward_gated(self, x: Tensor, candidates: Sequence[int], gates: Tensor) -> Tensor:
        """``sum_j gates[j] * op_{candidates[j]}(x)``: binary gates, gradients reach all."""
        out = 0
        for j, option in enumerate(candidates):
            out = out + gates[j] * self.ops[self.option_keys[option]](x)
        return out


class DifferentiableSpace(SearchSpace):
    """A search space whose searchable layers are :class:`GatedMixedOp` (FDNAS's space API).

    Subclasses build their network exactly as for ``SearchSpace`` (``forward(x, arch)``
    runs one path, passing each searchable layer its ``arch`` entry), with ``GatedMixedOp``
    in place of ``MixedOp``; everything in :data:`DIFFERENTIABLE_API` is derived here.
    """

    def __init__(self, net: nn.Module, **kwargs: Any) -> None:
        """As :class:`SearchSpace` (``input_shape``, ``input_dtype``, ``spec``)."""
        super().__init__(net, **kwargs)
        plain = [c.name for c in self.choices if not isinstance(self._layer(c.name), GatedMixedOp)]
        if plain:
            raise ValueError(
                f"{type(self).__name__}: searchable layer(s) {plain} have no architecture "
                "parameters; build them as fedorasflwr.search_spaces.GatedMixedOp"
            )

    def _layer(self, name: str) -> nn.Module:
        return self.net.get_submodule(name)

    def alpha_keys(self) -> tuple[str, ...]:
        """``state_dict`` keys of the architecture parameters, one per searchable layer."""
        return tuple(f"net.{choice.name}.alpha" for choice in self.choices)

    def arch_parameters(self) -> list[nn.Parameter]:
        """The ``alpha`` of every searchable layer, in layer order."""
        return [self._layer(choice.name).alpha for choice in self.choices]

    def weight_parameters(self) -> list[nn.Parameter]:
        """Every parameter but the ``alpha``s (the network weights ``w``)."""
        alphas = {id(p) for p in self.arch_parameters()}
        return [p for p in self.parameters() if id(p) not in alphas]

    def probabilities(self) -> list[Tensor]:
        """``softmax(alpha)`` of every layer (differentiable)."""
        return [torch.softmax(alpha, dim=0) for alpha in self.arch_parameters()]

    def expected_flops(self) -> Tensor:
        """Expected FLOPs of a path drawn from ``softmax(alpha)`` (differentiable in alpha)."""
        device = self.arch_parameters()[0].device
        total = torch.tensor(float(self.fixed_cost.flops), device=device)
        for layer, probs in enumerate(self.probabilities()):
            flops = torch.tensor(
                [float(self.option_cost(layer, o).flops) for o in range(len(probs))],
                device=device,
            )
            total = total + (probs * flops).sum()
        return total

    def derive(self, max_flops: float | None = None) -> tuple[int, ...]:
        """The derived ("normal") net: argmax alpha per layer.

        With ``max_flops`` (absolute), the most probable path under ``softmax(alpha)``
        whose FLOPs stay within it: the argmax when that fits, else the path maximising
        ``sum(log p)`` among those that fit (exact, by keeping per layer only the
        partial paths no other beats on both FLOPs and probability).  The hardware
        term bounds *expected* FLOPs; the argmax of a soft distribution can land on
        either side of it, and a device's limit is a bound on the net it runs."""
        argmax = tuple(int(alpha.detach().argmax()) for alpha in self.arch_parameters())
        if max_flops is None or self.cost(argmax).flops <= max_flops:
            return argmax
        if self.min_flops() > max_flops:
            raise ValueError(
                f"no path of the {self.spec['name']!r} space fits in {max_flops:.6g} FLOPs "
                f"(the cheapest has {self.min_flops()})"
            )
        costs = [
            [self.option_cost(layer, o).flops for o in range(options)]
            for layer, options in enumerate(self.num_options())
        ]
        return most_probable_within(
            self.arch_parameters(), costs, max_flops - self.fixed_cost.flops
        )

    def forward_gated(
        self, x: Tensor, candidates: Sequence[Sequence[int]], gates: Sequence[Tensor]
    ) -> Tensor:
        """Run each layer's ``candidates`` weighted by ``gates`` (binary, one active)."""
        if len(candidates) != len(self.choices) or len(gates) != len(self.choices):
            raise ValueError(
                f"forward_gated needs candidates and gates for {len(self.choices)} layers, "
                f"got {len(candidates)} and {len(gates)}"
            )
        choices = []
        for layer, (options, layer_gates) in enumerate(zip(candidates, gates, strict=True)):
            picked = tuple(self._option_index(layer, self.choices[layer], o) for o in options)
            if len(layer_gates) != len(picked):
                raise ValueError(
                    f"layer {layer}: {len(picked)} candidates but {len(layer_gates)} gates"
                )
            choices.append(GatedChoice(picked, layer_gates))
        return self.net(x, tuple(choices))


def most_probable_within(
    alphas: Sequence[Tensor], costs: Sequence[Sequence[float]], budget: float
) -> tuple[int, ...]:
    """The path maximising ``sum(log softmax(alpha))`` whose summed option ``costs`` (per
    layer, per option: FLOPs or milliseconds) stay within ``budget``; exact (the most
    probable path of :func:`probable_frontier`).  Raises ``ValueError`` if even the
    cheapest path exceeds ``budget``."""
    return probable_frontier(alphas, costs, budget)[-1][2]


def probable_frontier(
    alphas: Sequence[Tensor], costs: Sequence[Sequence[float]], budget: float
) -> list[tuple[float, float, tuple[int, ...]]]:
    """Every path within ``budget`` that no other path within it beats on both summed
    option ``costs`` and ``sum(log softmax(alpha))``: ``(cost, log-probability, path)``,
    cheapest first, each more probable than every cheaper one (so the last is the most
    probable).  Exact, by keeping per layer only the partial paths no other beats on both
    (a common suffix keeps the order).  Any score that rises with the log-probability and
    does not rise with the cost is maximised by one of them.  Raises ``ValueError`` if even
    the cheapest path exceeds ``budget``."""
    frontier: list[tuple[float, float, tuple[int, ...]]] = [(0, 0.0, ())]
    for alpha, layer_costs in zip(alphas, costs, strict=True):
        logp = torch.log_softmax(alpha.detach().double(), dim=0).tolist()
        grown = sorted(
            (
                (cost + layer_costs[o], score + logp[o], path + (o,))
                for cost, score, path in frontier
                for o in range(len(logp))
                if cost + layer_costs[o] <= budget
            ),
            key=lambda t: (t[0], -t[1]),
        )
        frontier = []
        for candidate in grown:  # cheapest first: keep those more probable than all cheaper
            if not frontier or candidate[1] > frontier[-1][1]:
                frontier.append(candidate)
        if not frontier:
            raise ValueError(f"no path fits in the budget {budget:.6g}")
    return frontier


def require_differentiable(space: Any, method: str = "FDNAS") -> None:
    """Raise ``ValueError`` naming what ``space`` lacks to be searched by ``method``:
    a ``SearchSpace``, the methods of :data:`DIFFERENTIABLE_API`, or one registered
    ``alpha`` parameter of shape ``(options,)`` per searchable layer."""
    how = (
        "subclass fedorasflwr.search_spaces.DifferentiableSpace and build the searchable "
        "layers as GatedMixedOp (docs/fdnas.md)"
    )
    if not isinstance(space, SearchSpace):
        raise ValueError(f"{method} needs a SearchSpace, got {type(space).__name__}; {how}")
    name = class_path(type(space))
    missing = [m for m in DIFFERENTIABLE_API if not callable(getattr(space, m, None))]
    if missing:
        raise ValueError(
            f"{method} needs a search space with architecture parameters; {name} lacks "
            f"{', '.join(missing)}: {how}"
        )
    alphas = list(space.arch_parameters())
    registered = {id(p) for p in space.parameters()}
    if len(alphas) != len(space.choices):
        raise ValueError(
            f"{method}: {name}.arch_parameters() gives {len(alphas)} tensors for "
            f"{len(space.choices)} searchable layers; it needs one per layer"
        )
    for layer, (alpha, options) in enumerate(zip(alphas, space.num_options(), strict=True)):
        if not isinstance(alpha, nn.Parameter) or id(alpha) not in registered:
            raise ValueError(
                f"{method}: the architecture parameters of layer {layer} of {name} are not "
                "an nn.Parameter of the space (they would not travel in its state_dict)"
            )
        if tuple(alpha.shape) != (options,):
            raise ValueError(
                f"{method}: the architecture parameters of layer {layer} of {name} have "
                f"shape {tuple(alpha.shape)}; expected ({options},), one per option"
            )
