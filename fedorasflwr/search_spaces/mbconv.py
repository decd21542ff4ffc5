"""The ``mbconv`` space: a ProxylessNAS-style chain of MBConv layers (FDNAS / CFDNAS).

ProxylessNAS (Cai et al., ICLR 2019) and FDNAS (Zhang et al., arXiv:2011.03372):
a fixed stem and first MBConv (expansion 1), then stages of searchable
layers, each choosing among MBConv with kernel 3/5/7 and expansion 3/6, plus
``identity`` (skip the layer) where input and output shapes agree; a fixed
1x1 head, then global average pooling (the paper's) or a flatten of the head's
feature map, and a linear classifier.  The paper's space has 19 searchable layers
on 32x32 / 224x224 inputs; here depth and width scale so a 2-core CPU can search
on 28x28 MNIST.

The ``head`` is a choice as in ``cnn_s`` / ``cnn_l`` (``fedorasflwr.search_spaces.cnn``),
but here the paper's ``"gap"`` stays the default: trained by FedAvg at Dirichlet 0.1 this
space's sampled nets gain 16.6 pp (median of 5) with the flatten head, at alpha 1.0 they
lose 1.0 pp, and in CFDNAS's quick class-group search at lr 0.1 the flatten head diverged
in the first round and left the FDNAS net at chance (issue 40; docs/fdnas.md,
``benchmarks/space_ablation.py`` row groups ``mbconv`` and ``mbconv-flatten``).  Files written
before the choice hold GAP nets (:func:`fedorasflwr.search_spaces.cnn.as_written` reads
them so).

What the head leaves is depth: at the same MACs, the flatten head's nets of 6 or 3
searchable layers (``layers_per_stage`` 2 or 1, wider) train by FedAvg at Dirichlet 0.1 as
well as the hand-made ConvNet, where those of 12 (0.4.0's default) fall 9.5 pp short (median);
with GAP, fewer layers help as much but none closes the gap; centrally the 12-layer nets are
within 3 pp of the ConvNet (``space_ablation.py`` row groups ``mbconv-6-layers``,
``mbconv-3-layers``, their ``-gap`` twins, ``mbconv-central``; docs/fdnas.md, "Depth").  The
run config's ``space.layers-per-block = "auto"`` builds 2 layers a stage, as this class's
default does.

Each searchable layer carries its architecture parameters ``alpha`` (one
logit per option) as an ``nn.Parameter``, so they are in ``state_dict`` and
travel in the ``ArrayRecord`` with the weights (keys ``*.alpha``, listed by
``alpha_keys()``): its layers are ``GatedMixedOp`` and the space a
``DifferentiableSpace`` (``differentiable.py``), which gives the rest of what
FDNAS uses.  Weight steps run one sampled path (``forward(x, arch)``,
binary gates); alpha steps run a few candidates per layer with binary gates
(``forward_gated``) for the ProxylessNAS gradient estimator.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .base import image_spec, positive_float, positive_int, register_space
from .cnn import _strided, head_name
from .differentiable import DifferentiableSpace, GatedMixedOp

__all__ = ["MBCONV_OPTIONS", "GatedMixedOp", "MBConv", "MBConvSpace", "mbconv"]

MBCONV_OPTIONS = tuple(f"mbconv_k{k}_e{e}" for e in (3, 6) for k in (3, 5, 7))
"""Options of every searchable layer (``identity`` is added where shapes allow)."""

STAGES = ((24, 2), (40, 2), (64, 1))
"""(output channels at width 1, stride of the stage's first layer); paper: 6 stages."""


def _channels(value: float) -> int:
    return max(4, 2 * round(value / 2))


class MBConv(nn.Module):
    """Inverted residual (MobileNetV2): 1x1 expand, k x k depthwise, linear 1x1 project."""

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int, expansion: int, stride: int
    ) -> None:
        super().__init__()
        hidden = in_channels * expansion
        layers: list[nn.Module] = []
        if expansion != 1:
            layers += [
                nn.Conv2d(in_channels, hidden, 1, bias=False),
                nn.BatchNorm2d(hidden),
                nn.ReLU6(),
            ]
        layers += [
            nn.Conv2d(
                hidden, hidden, kernel_size, stride, kernel_size // 2, groups=hidden, bias=False
            ),
            nn.BatchNorm2d(hidden),
            nn.ReLU6(),
            nn.Conv2d(hidden, out_channels, 1, bias=False),
            nn.BatchNorm2d(out_channels),
        ]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and in_channels == out_channels

    def forward(self, x: Tensor) -> Tensor:
        out = self.body(x)
        return x + out if self.residual else out


def _layer(in_channels: int, out_channels: int, stride: int) -> GatedMixedOp:
    options: dict[str, nn.Module] = {
        f"mbconv_k{k}_e{e}": MBConv(in_channels, out_channels, k, e, stride)
        for e in (3, 6)
        for k in (3, 5, 7)
    }
    if stride == 1 and in_channels == out_channels:
        options["identity"] = nn.Identity()
    return GatedMixedOp(options)


class MBConvSupernet(nn.Module):
    """Stem -> MBConv e1 -> searchable layers -> 1x1 head -> GAP or flatten -> linear."""

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        width: float,
        layers_per_stage: int,
        head: str = "gap",
        input_size: tuple[int, int] = (28, 28),
    ) -> None:
        super().__init__()
        stem = _channels(16 * width)
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, stem, 3, 2, 1, bias=False),
            nn.BatchNorm2d(stem),
            nn.ReLU6(),
            MBConv(stem, _channels(8 * width), 3, 1, 1),
        )
        channels = _channels(8 * width)
        layers = []
        for out, stride in STAGES:
            out = _channels(out * width)
            for index in range(layers_per_stage):
                layers.append(_layer(channels, out, stride if index == 0 else 1))
                channels = out
        self.layers = nn.ModuleList(layers)
        features = _channels(128 * width)
        self.head = nn.Sequential(
            nn.Conv2d(channels, features, 1, bias=False), nn.BatchNorm2d(features), nn.ReLU6()
        )
        self.flatten_head = head == "flatten"
        if self.flatten_head:  # the stem and each stage's first layer stride (odd k, pad k // 2)
            height, width_px = (_strided(size, 2) for size in input_size)
            for _, stride in STAGES:
                height, width_px = _strided(height, stride), _strided(width_px, stride)
            features *= height * width_px
        self.classifier = nn.Linear(features, num_classes)

    def forward(self, x: Tensor, arch: Sequence[int]) -> Tensor:
        x = self.stem(x)
        for layer, option in zip(self.layers, arch, strict=True):
            x = layer(x, option)
        x = self.head(x)
        return self.classifier(torch.flatten(x, 1) if self.flatten_head else x.mean((2, 3)))


@register_space
class MBConvSpace(DifferentiableSpace):
    """``mbconv``: ProxylessNAS-style supernet with per-layer ``alpha`` (FDNAS space).

    Stem conv3x3 stride 2 (16 x width channels) and a fixed MBConv e1 (8 x width);
    three stages (24, 40, 64 x width channels; strides 2, 2, 1) of
    ``layers_per_stage`` searchable layers with options :data:`MBCONV_OPTIONS`
    (+ ``identity`` in every layer but a stage's first); a 1x1 head (128 x width),
    then ``head``: ``"gap"`` (the paper's global average pooling, the default) or
    ``"flatten"``; linear.  Paper: 19 searchable layers in 6 stages.
    """

    name = "mbconv"

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 1,
        input_height: int = 28,
        input_width: int = 28,
        width: float = 1.0,
        layers_per_stage: int = 2,
        head: str = "gap",
    ) -> None:
        spec = {
            **image_spec(num_classes, in_channels, input_height, input_width),
            "width": positive_float("width", width),
            "layers_per_stage": positive_int("layers_per_stage", layers_per_stage),
            "head": head_name(head),
        }
        net = MBConvSupernet(
            spec["in_channels"],
            spec["num_classes"],
            spec["width"],
            spec["layers_per_stage"],
            head=spec["head"],
            input_size=(spec["input_height"], spec["input_width"]),
        )
        super().__init__(
            net,
            input_shape=(spec["in_channels"], spec["input_height"], spec["input_width"]),
            input_dtype=torch.float32,
            spec=spec,
        )


mbconv = MBConvSpace
"""Alias: ``mbconv(num_classes=10, ...)`` reads like the design table."""
