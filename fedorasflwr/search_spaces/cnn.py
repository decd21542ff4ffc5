"""The FedorAS image search spaces ``cnn_l`` (CIFAR) and ``cnn_s`` (Speech Commands).

FedorAS paper, App. E.3 and Fig. 7: a fixed stem, searchable blocks of
shape-preserving layers, each block followed by a fixed reduction block that
halves the resolution and multiplies the channels by 1.5, then a linear classifier.
Channel counts scale with ``width`` (rounded to an even number, at least 4) so tests
can run tiny networks.

The classifier's input is the ``head``: ``"flatten"`` (the default) flattens the last
feature map, ``"gap"`` averages it over space (global average pooling, the paper's
Fig. 7). Under FedAvg on skewed clients the GAP head's nets train far more slowly than
the same nets with a flatten head (issue 40, ``benchmarks/space_ablation.py``), so the
flatten head is this project's default; ``head="gap"`` builds the paper's space (its
parameter and MAC counts, ``tests/search_spaces/test_cnn_l_layout.py``). Files written
before the head was a choice hold GAP nets (`fedorasflwr.model_files` reads them so).

``cnn_s``'s ``reduction`` is max pooling first (``"maxpool-conv1x1"``, :class:`PoolReduction`,
the default since 0.5.0) or the paper's conv1x1 then average pooling
(``"conv1x1-avgpool"``); files written before it was a choice hold the paper's.
:func:`as_written` gives a file's spec the choices its version built.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import MixedOp, SearchSpace, image_spec, positive_float, positive_int, register_space
from .ops import CONV_OPS, ConvNormAct, make_op

__all__ = [
    "HEADS",
    "DEFAULT_REDUCTION",
    "PAPER_REDUCTION",
    "REDUCTIONS",
    "CNNLargeSpace",
    "CNNSmallSpace",
    "as_written",
    "cnn_l",
    "cnn_s",
]

LARGE_OPTIONS = (
    "conv1x1",
    "dsconv3x3_e0.5",
    "dsconv3x3_e1",
    "dsconv3x3_e2",
    "mbconv_k1_e2",
    "mbconv_k3_e0.5",
    "mbconv_k3_e1",
    "mbconv_k3_e2",
    "identity",
)
"""Options of every ``cnn_l`` layer (paper: CIFAR-10/100 space)."""

SMALL_OPTIONS = ("conv1x1", "conv3x3", "dsconv1x1_e2", *LARGE_OPTIONS[1:])
"""Options of every ``cnn_s`` layer: the ``cnn_l`` ones plus conv3x3 and DSConv k1 e2."""

CHANNEL_GROWTH = 1.5

HEADS = ("flatten", "gap")
"""What the classifier reads: the flattened last feature map, or its spatial mean."""

REDUCTIONS = ("conv1x1-avgpool", "maxpool-conv1x1")
"""``cnn_s``'s reduction: the paper's 1x1 convolution that changes the channels, then a 3x3
average pooling (stride 2); or a 3x3 max pooling (stride 2), then that 1x1 convolution."""

PAPER_REDUCTION = "conv1x1-avgpool"
"""The paper's ``cnn_s`` reduction: what every file written before the choice holds."""

DEFAULT_REDUCTION = "maxpool-conv1x1"
"""This project's ``cnn_s`` reduction (since 0.5.0): under FedAvg its nets train far better
on 32x32 images and as well on MNIST-5k (issue 40, ``benchmarks/README.md``)."""


def as_written(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A ``cnn_s`` / ``cnn_l`` / ``mbconv`` / ``darts`` space spec read from a file, with the
    values of the choices added since that file's version: no ``head`` (``cnn_s`` /
    ``cnn_l``: fedorasflwr < 0.3.0; ``mbconv``, ``darts``: 0.4.0 and earlier): the nets
    averaged the last feature map (``"gap"``); no ``reduction`` (``cnn_s``, fedorasflwr
    0.4.0 and earlier): the paper's conv1x1 then average pooling. Other specs are returned
    as they are."""
    out = dict(spec)
    if out.get("name") in ("cnn_s", "cnn_l", "mbconv", "darts"):
        out.setdefault("head", "gap")
    if out.get("name") == "cnn_s":
        out.setdefault("reduction", PAPER_REDUCTION)
    return out


def _channels(value: float) -> int:
    """Even (so expansion 0.5 splits channels evenly) and at least 4."""
    return max(4, 2 * round(value / 2))


def _strided(size: int, stride: int) -> int:
    """The output size of an odd k x k window with padding k // 2 at ``stride`` (every stem
    and reduction of these spaces, and ``mbconv``'s stem and depthwise convolutions)."""
    return (size - 1) // stride + 1


def reduction_name(value: object) -> str:
    """``value`` as one of :data:`REDUCTIONS`, or ``ValueError`` naming the allowed ones."""
    if value not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {', '.join(REDUCTIONS)}, got {value!r}")
    return str(value)


def head_name(value: object) -> str:
    """``value`` as one of :data:`HEADS`, or ``ValueError`` naming the allowed ones."""
    if value not in HEADS:
        raise ValueError(f"head must be one of {', '.join(HEADS)}, got {value!r}")
    return str(value)


class SeparableReduction(nn.Module):
    """``cnn_l`` reduction: DSConv3x3 stride 2 (C -> 1.5C) plus a 2x2-conv stride-2 residual."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.depthwise = ConvNormAct(in_channels, in_channels, 3, stride=2, groups=in_channels)
        self.pointwise = ConvNormAct(in_channels, out_channels, 1)
        self.shortcut = ConvNormAct(in_channels, out_channels, 2, stride=2, padding=0)

    def forward(self, x: Tensor) -> Tensor:
        height, width = x.shape[-2:]
        # Pad odd sizes so the 2x2 residual matches the 3x3 branch's ceil(size / 2).
        shortcut = self.shortcut(F.pad(x, (0, width % 2, 0, height % 2)))
        return self.pointwise(self.depthwise(x)) + shortcut


class PoolReduction(nn.Module):
    """``cnn_s`` reduction (C -> 1.5C, half the size): ``order`` ``"conv1x1-avgpool"`` (the
    paper's) runs the conv1x1 + BN + ReLU, then a 3x3 average pooling with stride 2;
    ``"maxpool-conv1x1"`` pools first (3x3 max, stride 2), then runs the conv1x1 + BN + ReLU.

    Both hold the same weights (one conv1x1 and its BN); pooling first runs the conv1x1 on a
    quarter of the positions. On a 32x32 image set of shapes, fixed nets of one tier's MACs
    train far better with max pooling first (``benchmarks/space_ablation.py``, rows
    ``reduction``); it is not the default because FedorAS's Stage 1 at its lr trained worse
    with it on MNIST-5k (docs/fedoras.md, deviations from the paper).
    """

    def __init__(self, in_channels: int, out_channels: int, order: str = PAPER_REDUCTION) -> None:
        super().__init__()
        self.pool_first = reduction_name(order) == "maxpool-conv1x1"
        self.conv = ConvNormAct(in_channels, out_channels, 1)
        self.pool = (
            nn.MaxPool2d(3, stride=2, padding=1)
            if self.pool_first
            else nn.AvgPool2d(3, stride=2, padding=1)
        )

    def forward(self, x: Tensor) -> Tensor:
        if self.pool_first:
            return self.conv(self.pool(x))
        return self.pool(self.conv(x))


class SearchBlock(nn.Module):
    """A feed-forward stack of searchable, shape-preserving layers."""

    def __init__(self, channels: int, num_layers: int, options: Sequence[str]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            MixedOp({name: make_op(CONV_OPS, name, channels) for name in options})
            for _ in range(num_layers)
        )


class ConvSupernet(nn.Module):
    """Stem -> (searchable block -> reduction) x N -> head (flatten or GAP) -> linear."""

    def __init__(
        self,
        *,
        in_channels: int,
        input_size: tuple[int, int],
        head: str,
        stem_channels: int,
        stem_stride: int,
        block_layers: Sequence[int],
        options: Sequence[str],
        reduction: Callable[[int, int], nn.Module],
        num_classes: int,
    ) -> None:
        super().__init__()
        self.stem = ConvNormAct(in_channels, stem_channels, 3, stride=stem_stride)
        blocks, reductions = [], []
        channels = stem_channels
        for num_layers in block_layers:
            blocks.append(SearchBlock(channels, num_layers, options))
            out_channels = _channels(channels * CHANNEL_GROWTH)
            reductions.append(reduction(channels, out_channels))
            channels = out_channels
        # All blocks are registered before the reductions, so searchable layers
        # appear in forward order in named_modules().
        self.blocks = nn.ModuleList(blocks)
        self.reductions = nn.ModuleList(reductions)
        self.flatten_head = head == "flatten"
        features = channels
        if self.flatten_head:  # every reduction halves the size (3x3 window, stride 2, padding 1)
            height, width = (_strided(size, stem_stride) for size in input_size)
            for _ in block_layers:
                height, width = _strided(height, 2), _strided(width, 2)
            features = channels * height * width
        self.classifier = nn.Linear(features, num_classes)

    def forward(self, x: Tensor, arch: Sequence[int]) -> Tensor:
        x = self.stem(x)
        options = iter(arch)
        for block, reduction in zip(self.blocks, self.reductions, strict=True):
            for layer in block.layers:
                x = layer(x, next(options))
            x = reduction(x)
        return self.classify(x)

    def classify(self, x: Tensor) -> Tensor:
        """The logits of the last feature map ``x``: its head (flatten or GAP), then the
        linear classifier."""
        return self.classifier(torch.flatten(x, 1) if self.flatten_head else x.mean((2, 3)))


@register_space
class CNNLargeSpace(SearchSpace):
    """``cnn_l``: the FedorAS CIFAR space (paper App. E.3, Fig. 7 left).

    Stem conv3x3 (64 x width channels, stride 1); ``blocks`` searchable blocks of
    ``layers_per_block`` layers with options :data:`LARGE_OPTIONS`, each
    followed by a :class:`SeparableReduction`; the ``head`` (flatten, or the paper's GAP)
    and a linear classifier.

    The default, 3 blocks of 4, is the layout App. E.3's text describes; the paper's public
    code (``configs/datasets/cifar10.yaml``, ``cifar100.yaml``: ``blocks: [4,4,4,4]``) builds
    4 blocks of 4, the supernet of 22.3M parameters that Sec. 4.5 sends whole
    (``blocks=4`` here; docs/fedoras.md compares the two).
    """

    name = "cnn_l"

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 3,
        input_height: int = 32,
        input_width: int = 32,
        width: float = 1.0,
        layers_per_block: int = 4,
        blocks: int = 3,
        head: str = "flatten",
    ) -> None:
        spec = {
            **image_spec(num_classes, in_channels, input_height, input_width),
            "width": positive_float("width", width),
            "layers_per_block": positive_int("layers_per_block", layers_per_block),
            "blocks": positive_int("blocks", blocks),
            "head": head_name(head),
        }
        net = ConvSupernet(
            in_channels=spec["in_channels"],
            input_size=(spec["input_height"], spec["input_width"]),
            head=spec["head"],
            stem_channels=_channels(64 * spec["width"]),
            stem_stride=1,
            block_layers=(spec["layers_per_block"],) * spec["blocks"],
            options=LARGE_OPTIONS,
            reduction=SeparableReduction,
            num_classes=spec["num_classes"],
        )
        super().__init__(
            net,
            input_shape=(spec["in_channels"], spec["input_height"], spec["input_width"]),
            input_dtype=torch.float32,
            spec=spec,
        )


@register_space
class CNNSmallSpace(SearchSpace):
    """``cnn_s``: the FedorAS Speech Commands space (paper App. E.3, Fig. 7 middle).

    Stem conv3x3 (16 x width channels, stride ``stem_stride``); searchable blocks
    of 1, 1 and 2 layers with options :data:`SMALL_OPTIONS`, each followed by a
    :class:`PoolReduction` (``reduction``: the paper's conv1x1 then average pooling, or max
    pooling then the conv1x1); the ``head`` (flatten, or the paper's GAP) and a linear
    classifier.  Also fits MNIST-like 1x28x28 inputs.
    """

    name = "cnn_s"

    def __init__(
        self,
        num_classes: int = 12,
        in_channels: int = 1,
        input_height: int = 40,
        input_width: int = 51,
        width: float = 1.0,
        stem_stride: int = 1,
        head: str = "flatten",
        reduction: str = DEFAULT_REDUCTION,
    ) -> None:
        spec = {
            **image_spec(num_classes, in_channels, input_height, input_width),
            "width": positive_float("width", width),
            "stem_stride": positive_int("stem_stride", stem_stride),
            "head": head_name(head),
            "reduction": reduction_name(reduction),
        }
        net = ConvSupernet(
            in_channels=spec["in_channels"],
            input_size=(spec["input_height"], spec["input_width"]),
            head=spec["head"],
            stem_channels=_channels(16 * spec["width"]),
            stem_stride=spec["stem_stride"],
            block_layers=(1, 1, 2),
            options=SMALL_OPTIONS,
            reduction=functools.partial(PoolReduction, order=spec["reduction"]),
            num_classes=spec["num_classes"],
        )
        super().__init__(
            net,
            input_shape=(spec["in_channels"], spec["input_height"], spec["input_width"]),
            input_dtype=torch.float32,
            spec=spec,
        )


cnn_l = CNNLargeSpace
"""Alias: ``cnn_l(num_classes=10, ...)`` reads like the design table."""
cnn_s = CNNSmallSpace
"""Alias: ``cnn_s(num_classes=12, ...)`` reads like the design table."""
