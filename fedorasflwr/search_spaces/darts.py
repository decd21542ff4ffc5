"""The DARTS cell space (Liu et al., 2019; DP-FNAS, Singh et al., 2020, §4.1).

A stem, then ``cells`` cells (reduction cells at 1/3 and 2/3 of the depth),
a head and a linear classifier.  The ``head`` is what the classifier reads: ``"gap"``
(DARTS's global average pooling, the default of the class) or ``"flatten"`` (the last
cell's map flattened, C x H x W; ``space.head = "auto"`` gives the darts space this one:
at Dirichlet 0.1 the derived nets train 17-19 pp better under FedAvg, issue 40,
``benchmarks/space_ablation.py``, with the final training's gradient clipped at norm 5).
A cell has two inputs (the two previous cells' outputs) and four intermediate nodes; node
``i`` sums one edge from every earlier node (14 edges per cell), and the cell outputs the
concatenation of its four nodes.  Every edge is a :class:`DartsEdge` over the
8 DARTS options.  All normal cells share ``alpha_normal`` (14 x 8) and all
reduction cells ``alpha_reduce``; both are ``nn.Parameter`` s of the space, so
they are in ``state_dict`` and travel with the weights.

Normalisation is ``GroupNorm`` throughout: BatchNorm mixes the samples of a
batch, so per-sample gradients (DP-SGD) would be wrong and opacus rejects it.

``space(x)`` is the softmax-mixed forward; ``space(x, arch)`` runs one option
per edge (the base class's single-path interface, used for cost tables).
``derive_genotype`` keeps the top-2 non-zero inputs of every node, and
``DerivedNetwork(genotype, ...)`` is the stand-alone network built from it.
``arch_keys``, ``genotype()`` and ``derived_network`` are the DARTS-style API DP-FNAS
uses (``darts_style.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import MixedOp, SearchSpace, image_spec, positive_int, register_space
from .cnn import head_name

__all__ = [
    "PRIMITIVES",
    "DartsEdge",
    "DartsSpace",
    "DerivedNetwork",
    "Genotype",
    "derive_genotype",
    "final_map_size",
    "genotype_cost",
    "searched_cells",
    "unsearched_lines",
    "unsearched_note",
]

PRIMITIVES = (
    "none",
    "max_pool_3x3",
    "avg_pool_3x3",
    "skip_connect",
    "sep_conv_3x3",
    "sep_conv_5x5",
    "dil_conv_3x3",
    "dil_conv_5x5",
)
"""The 8 DARTS options, in DARTS order (``none`` is the zero op)."""

NODES = 4
EDGES = sum(2 + i for i in range(NODES))  # 14


def _norm(channels: int, affine: bool) -> nn.GroupNorm:
    return nn.GroupNorm(math.gcd(channels, 4), channels, affine=affine)


class ReLUConvNorm(nn.Module):
    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, padding: int, affine: bool):
        super().__init__()
        self.op = nn.Sequential(
            nn.ReLU(),
            nn.Conv2d(c_in, c_out, kernel, stride, padding, bias=False),
            _norm(c_out, affine),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.op(x)


class DilConv(nn.Module):
    """ReLU, depthwise (dilated) conv, pointwise conv, norm."""

    def __init__(
        self, c_in: int, c_out: int, kernel: int, stride: int, dilation: int, affine: bool
    ):
        super().__init__()
        padding = dilation * (kernel - 1) // 2
        self.op = nn.Sequential(
            nn.ReLU(),
            nn.Conv2d(c_in, c_in, kernel, stride, padding, dilation, groups=c_in, bias=False),
            nn.Conv2d(c_in, c_out, 1, bias=False),
            _norm(c_out, affine),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.op(x)


class SepConv(nn.Module):
    """Two stacked depthwise-separable convolutions (the first carries the stride)."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, affine: bool):
        super().__init__()
        self.op = nn.Sequential(
            DilConv(c_in, c_in, kernel, stride, 1, affine),
            DilConv(c_in, c_out, kernel, 1, 1, affine),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.op(x)


class Zero(nn.Module):
    def __init__(self, stride: int):
        super().__init__()
        self.stride = stride

    def forward(self, x: Tensor) -> Tensor:
        return x[:, :, :: self.stride, :: self.stride].mul(0.0)


class FactorizedReduce(nn.Module):
    """Halve the resolution with two offset 1x1 convs (works for odd sizes too)."""

    def __init__(self, c_in: int, c_out: int, affine: bool):
        super().__init__()
        self.conv_1 = nn.Conv2d(c_in, c_out // 2, 1, 2, bias=False)
        self.conv_2 = nn.Conv2d(c_in, c_out - c_out // 2, 1, 2, bias=False)
        self.norm = _norm(c_out, affine)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(x)
        shifted = F.pad(x[:, :, 1:, 1:], (0, 1, 0, 1))
        return self.norm(torch.cat([self.conv_1(x), self.conv_2(shifted)], dim=1))


def make_darts_op(name: str, channels: int, stride: int, affine: bool) -> nn.Module:
    """One DARTS option; unknown names raise ``ValueError`` listing the valid ones."""
    c = channels
    if name == "none":
        return Zero(stride)
    if name == "max_pool_3x3":
        return nn.MaxPool2d(3, stride, padding=1)
    if name == "avg_pool_3x3":
        return nn.AvgPool2d(3, stride, padding=1, count_include_pad=False)
    if name == "skip_connect":
        return nn.Identity() if stride == 1 else FactorizedReduce(c, c, affine)
    if name in ("sep_conv_3x3", "sep_conv_5x5"):
        return SepConv(c, c, int(name[-1]), stride, affine)
    if name in ("dil_conv_3x3", "dil_conv_5x5"):
        return DilConv(c, c, int(name[-1]), stride, 2, affine)
    raise ValueError(f"unknown DARTS operation {name!r}; valid: {', '.join(PRIMITIVES)}")


class DartsEdge(MixedOp):
    """One edge: ``forward(x, option)`` runs one option, ``mixed(x, weights)`` their mix."""

    def __init__(self, channels: int, stride: int):
        super().__init__(
            {name: make_darts_op(name, channels, stride, False) for name in PRIMITIVES}
        )

    def mixed(self, x: Tensor, weights: Tensor) -> Tensor:
        return sum(w * self.ops[k](x) for w, k in zip(weights, self.option_keys, strict=True))


class _Preprocess(nn.Module):
    def __init__(self, c_pp: int, c_p: int, c: int, reduction_prev: bool, affine: bool):
        super().__init__()
        self.pre0 = (
            FactorizedReduce(c_pp, c, affine)
            if reduction_prev
            else ReLUConvNorm(c_pp, c, 1, 1, 0, affine)
        )
        self.pre1 = ReLUConvNorm(c_p, c, 1, 1, 0, affine)


class SearchCell(_Preprocess):
    def __init__(self, c_pp: int, c_p: int, c: int, reduction: bool, reduction_prev: bool):
        super().__init__(c_pp, c_p, c, reduction_prev, affine=False)
        self.reduction = reduction
        self.edges = nn.ModuleList(
            DartsEdge(c, 2 if reduction and j < 2 else 1)
            for i in range(NODES)
            for j in range(2 + i)
        )

    def forward(self, s0: Tensor, s1: Tensor, choice: Sequence[int] | Tensor) -> Tensor:
        """``choice``: one option per edge (ints), or a (14, 8) tensor of mixing weights."""
        states = [self.pre0(s0), self.pre1(s1)]
        offset = 0
        for _ in range(NODES):
            terms = []
            for j, h in enumerate(states):
                edge = self.edges[offset + j]
                if isinstance(choice, Tensor):
                    terms.append(edge.mixed(h, choice[offset + j]))
                else:
                    terms.append(edge(h, choice[offset + j]))
            offset += len(states)
            states.append(sum(terms))
        return torch.cat(states[2:], dim=1)


def _reduction_layers(cells: int) -> set[int]:
    return {cells // 3, 2 * cells // 3}


def searched_cells(cells: int) -> tuple[str, ...]:
    """The cell kinds a net of ``cells`` cells has, whose alphas a search moves:
    ``("normal", "reduce")``, or only ``("reduce",)`` for 1 or 2 cells (reductions at
    ``cells // 3`` and ``2 * cells // 3``: every cell). There ``alpha_normal`` gets no
    gradient and the normal half of the genotype is the initial alphas' (plus DP-FNAS's
    noise), not searched: two methods built from one seed derive the same normal half."""
    kinds = {"reduce" if layer in _reduction_layers(cells) else "normal" for layer in range(cells)}
    return tuple(k for k in ("normal", "reduce") if k in kinds)


def unsearched_note(cells: int) -> str:
    """``""`` when a net of ``cells`` cells searches both cells; else the line a summary
    prints beside the genotype, naming the half that is not searched."""
    missing = [k for k in ("normal", "reduce") if k not in searched_cells(cells)]
    if not missing:
        return ""
    return (
        f"{missing[0]} cell: none in this {cells}-cell net, so its half of the genotype is "
        "the initial alphas', not searched (3 or more cells search both)"
    )


def unsearched_lines(space: Mapping[str, Any]) -> list[str]:
    """A result document's ``space`` entry (``runs.describe_space``) -> the summary line of
    ``unsearched_note`` for a darts net, if any; none for another space."""
    spec = space.get("spec", {})
    if spec.get("name") != "darts" or "cells" not in spec:
        return []
    note = unsearched_note(int(spec["cells"]))
    return [note] if note else []


class _Stem(nn.Module):
    def __init__(self, in_channels: int, c: int, stride: int, affine: bool):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, c, 3, stride, 1, bias=False)
        self.norm = _norm(c, affine)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(self.conv(x))


def final_map_size(size: int, cells: int, stem_stride: int) -> int:
    """The side of the last cell's map for an input side ``size``: the stem (3x3, pad 1)
    and each reduction cell (stride 2, odd kernels padded k // 2, or a 1x1 stride-2
    ``FactorizedReduce``) take a side n to ``(n - 1) // stride + 1``."""
    size = (size - 1) // stem_stride + 1
    for _ in _reduction_layers(cells):
        size = (size - 1) // 2 + 1
    return size


def _classifier(head: str, channels: int, side: tuple[int, ...], num_classes: int) -> nn.Linear:
    """The linear classifier over the last cell's map (``channels`` x ``side``): it reads
    the map's global average (``"gap"``) or the map flattened (``"flatten"``)."""
    flatten = head_name(head) == "flatten"
    return nn.Linear(channels * math.prod(side) if flatten else channels, num_classes)


def _classify(classifier: nn.Linear, head: str, x: Tensor) -> Tensor:
    # the mean, not AdaptiveAvgPool2d: CUDA-deterministic
    return classifier(x.flatten(1) if head == "flatten" else x.mean(dim=(2, 3)))


class DartsNet(nn.Module):
    """The DARTS search network (the supernet)."""

    def __init__(
        self,
        in_channels,
        num_classes,
        channels,
        cells,
        stem_multiplier,
        stem_stride,
        head="gap",
        input_size=(28, 28),
    ):
        super().__init__()
        c_curr = stem_multiplier * channels
        self.stem = _Stem(in_channels, c_curr, stem_stride, affine=False)
        c_pp, c_p, c = c_curr, c_curr, channels
        self.cells = nn.ModuleList()
        self.reduction = []
        reduction_prev = False
        for layer in range(cells):
            reduction = layer in _reduction_layers(cells)
            if reduction:
                c *= 2
            self.cells.append(SearchCell(c_pp, c_p, c, reduction, reduction_prev))
            self.reduction.append(reduction)
            reduction_prev = reduction
            c_pp, c_p = c_p, NODES * c
        self.head = head
        side = tuple(final_map_size(n, cells, stem_stride) for n in input_size)
        self.classifier = _classifier(head, c_p, side, num_classes)
        self.alpha_normal = nn.Parameter(1e-3 * torch.randn(EDGES, len(PRIMITIVES)))
        self.alpha_reduce = nn.Parameter(1e-3 * torch.randn(EDGES, len(PRIMITIVES)))

    def forward(self, x: Tensor, arch: Sequence[int] | None = None) -> Tensor:
        if arch is None:
            normal = F.softmax(self.alpha_normal, dim=-1)
            reduce = F.softmax(self.alpha_reduce, dim=-1)
        s0 = s1 = self.stem(x)
        for index, cell in enumerate(self.cells):
            if arch is None:
                choice = reduce if self.reduction[index] else normal
            else:
                choice = arch[index * EDGES : (index + 1) * EDGES]
            s0, s1 = s1, cell(s0, s1, choice)
        return _classify(self.classifier, self.head, s1)


@register_space
class DartsSpace(SearchSpace):
    """DARTS cell search space with architecture parameters (DP-FNAS §4.1).

    Parameters
    ----------
    num_classes, in_channels, input_height, input_width : int
        The task (MNIST: 10, 1, 28, 28).
    channels : int (default: 4)
        Initial channels C (paper / DARTS CIFAR search: 16).
    cells : int (default: 3)
        Cells in the network (paper: 8), reductions at 1/3 and 2/3 of the depth.
    stem_multiplier : int (default: 3)
        Stem output channels = stem_multiplier x C (DARTS: 3).
    stem_stride : int (default: 1)
        Stride of the stem conv (DARTS: 1; 2 halves large inputs on CPU).
    head : str (default: "gap")
        What the classifier reads: ``"gap"`` (DARTS's global average pooling) or
        ``"flatten"`` (the last cell's map flattened; issue 40).
    """

    name = "darts"

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 1,
        input_height: int = 28,
        input_width: int = 28,
        channels: int = 4,
        cells: int = 3,
        stem_multiplier: int = 3,
        stem_stride: int = 1,
        head: str = "gap",
    ) -> None:
        spec = {
            **image_spec(num_classes, in_channels, input_height, input_width),
            "channels": positive_int("channels", channels),
            "cells": positive_int("cells", cells),
            "stem_multiplier": positive_int("stem_multiplier", stem_multiplier),
            "stem_stride": positive_int("stem_stride", stem_stride),
            "head": head_name(head),
        }
        net = DartsNet(
            in_channels,
            num_classes,
            channels,
            cells,
            stem_multiplier,
            stem_stride,
            head,
            (input_height, input_width),
        )
        super().__init__(
            net,
            input_shape=(in_channels, input_height, input_width),
            input_dtype=torch.float32,
            spec=spec,
        )

    ARCH_KEYS = ("net.alpha_normal", "net.alpha_reduce")
    """``state_dict`` keys of the architecture variables A; every other key is a weight (W)."""

    def forward(self, x: Tensor, arch: Sequence[int] | None = None) -> Tensor:
        """Mixed forward (softmax of the alphas) without ``arch``; one path with it."""
        if arch is None:
            return self.net(x)
        return super().forward(x, arch)

    @property
    def arch_keys(self) -> tuple[str, ...]:
        """:data:`ARCH_KEYS` (the DARTS-style API of ``darts_style.py``)."""
        return self.ARCH_KEYS

    def weight_keys(self) -> tuple[str, ...]:
        """``state_dict`` keys of the operation weights W (everything but the alphas)."""
        return tuple(k for k in self.state_dict() if k not in self.ARCH_KEYS)

    @property
    def searched_cells(self) -> tuple[str, ...]:
        """The cell kinds of the net, whose alphas the search moves (``searched_cells``)."""
        return searched_cells(self.spec["cells"])

    def genotype(self) -> Genotype:
        """The genotype derived from the current alphas (top-2 non-zero inputs per node)."""
        return derive_genotype(self.net.alpha_normal.detach(), self.net.alpha_reduce.detach())

    @classmethod
    def derived_network(cls, genotype: str, **spec: int) -> DerivedNetwork:
        """The stand-alone network of a genotype's text (``Genotype.to_text``) for ``spec``."""
        return DerivedNetwork(Genotype.from_text(genotype), **spec)


@dataclass(frozen=True)
class Genotype:
    """A derived cell pair: per node, two ``(operation, input index)`` pairs.

    Inputs 0 and 1 are the cell's two inputs, 2.. the earlier intermediate nodes.
    """

    normal: tuple[tuple[str, int], ...]
    reduce: tuple[tuple[str, int], ...]

    def to_text(self) -> str:
        """``"sep_conv_3x3:0,skip_connect:1,...|..."`` (travels in a ConfigRecord)."""
        return "|".join(
            ",".join(f"{op}:{i}" for op, i in cell) for cell in (self.normal, self.reduce)
        )

    @classmethod
    def from_text(cls, text: str) -> Genotype:
        """Inverse of :meth:`to_text`; raises ``ValueError`` on a malformed genotype."""
        try:
            normal, reduce = (
                tuple((op, int(i)) for op, i in (pair.split(":") for pair in cell.split(",")))
                for cell in text.split("|")
            )
        except ValueError:
            raise ValueError(f"malformed genotype {text!r}") from None
        genotype = cls(normal, reduce)
        for cell in (normal, reduce):
            if len(cell) != 2 * NODES:
                raise ValueError(f"genotype {text!r}: each cell needs {2 * NODES} pairs")
            for k, (op, i) in enumerate(cell):
                if op not in PRIMITIVES or op == "none" or not 0 <= i < 2 + k // 2:
                    raise ValueError(f"genotype {text!r}: bad pair {op}:{i}")
        return genotype


def derive_genotype(alpha_normal: Tensor, alpha_reduce: Tensor) -> Genotype:
    """DARTS derivation: per node the 2 inputs with the strongest non-zero op, and that op."""
    none = PRIMITIVES.index("none")

    def parse(alpha: Tensor) -> tuple[tuple[str, int], ...]:
        weights = F.softmax(alpha, dim=-1).cpu()
        weights[:, none] = -1.0
        pairs: list[tuple[str, int]] = []
        start = 0
        for i in range(NODES):
            block = weights[start : start + 2 + i]
            best = block.max(dim=1)
            inputs = sorted(range(2 + i), key=lambda j: -float(best.values[j]))[:2]
            pairs += [(PRIMITIVES[int(best.indices[j])], j) for j in sorted(inputs)]
            start += 2 + i
        return tuple(pairs)

    return Genotype(parse(alpha_normal), parse(alpha_reduce))


class DerivedCell(_Preprocess):
    def __init__(self, genotype_cell, c_pp, c_p, c, reduction, reduction_prev):
        super().__init__(c_pp, c_p, c, reduction_prev, affine=True)
        self.inputs = [i for _, i in genotype_cell]
        self.ops = nn.ModuleList(
            make_darts_op(op, c, 2 if reduction and i < 2 else 1, True) for op, i in genotype_cell
        )

    def forward(self, s0: Tensor, s1: Tensor) -> Tensor:
        states = [self.pre0(s0), self.pre1(s1)]
        for node in range(NODES):
            a, b = 2 * node, 2 * node + 1
            states.append(self.ops[a](states[self.inputs[a]]) + self.ops[b](states[self.inputs[b]]))
        return torch.cat(states[2:], dim=1)


class DerivedNetwork(nn.Module):
    """The stand-alone network of a genotype (DARTS "augmentation" net, GroupNorm, no alphas).

    ``DerivedNetwork(genotype, **space.spec minus name)`` mirrors the search
    network's layout, its head included (a spec without ``head``, written before the
    darts space had one, is ``"gap"``); ``channels`` / ``cells`` may be larger for final
    training.
    """

    def __init__(
        self,
        genotype: Genotype,
        *,
        num_classes: int = 10,
        in_channels: int = 1,
        channels: int = 4,
        cells: int = 3,
        stem_multiplier: int = 3,
        stem_stride: int = 1,
        head: str = "gap",
        input_height: int = 28,
        input_width: int = 28,
        **_: int,
    ) -> None:
        super().__init__()
        self.genotype = genotype
        c_curr = stem_multiplier * channels
        self.stem = _Stem(in_channels, c_curr, stem_stride, affine=True)
        c_pp, c_p, c = c_curr, c_curr, channels
        self.cells = nn.ModuleList()
        reduction_prev = False
        for layer in range(cells):
            reduction = layer in _reduction_layers(cells)
            if reduction:
                c *= 2
            cell = genotype.reduce if reduction else genotype.normal
            self.cells.append(DerivedCell(cell, c_pp, c_p, c, reduction, reduction_prev))
            reduction_prev = reduction
            c_pp, c_p = c_p, NODES * c
        self.head = head
        side = tuple(final_map_size(n, cells, stem_stride) for n in (input_height, input_width))
        self.classifier = _classifier(head, c_p, side, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        s0 = s1 = self.stem(x)
        for cell in self.cells:
            s0, s1 = s1, cell(s0, s1)
        return _classify(self.classifier, self.head, s1)


def genotype_cost(space: SearchSpace, genotype: Any) -> int | None:
    """Forward FLOPs of ``genotype``'s path in the darts supernet: every edge a genotype
    keeps takes its operation, every other edge the zero op (``none``); ``None`` for a
    space without that layout (a DARTS-style space of one's own)."""
    net = getattr(space, "net", None)
    reduction = getattr(net, "reduction", None)
    if reduction is None or not hasattr(genotype, "normal"):
        return None

    def cell(pairs: Sequence[tuple[str, int]]) -> list[int]:
        arch, start = [PRIMITIVES.index("none")] * EDGES, 0
        for node in range(len(pairs) // 2):
            for op, j in pairs[2 * node : 2 * node + 2]:
                arch[start + j] = PRIMITIVES.index(op)
            start += 2 + node
        return arch

    arch = [i for r in reduction for i in cell(genotype.reduce if r else genotype.normal)]
    return int(space.cost(tuple(arch)).flops)
