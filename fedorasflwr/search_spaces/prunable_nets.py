"""The built-in prunable nets of DecNAS (paper, Table 2), plain ``nn.Module`` classes.

- ``convnet`` (:class:`ConvNet`): a simplified AlexNet, six CONV (3x3, BN, ReLU) layers
  with a 2x2 max-pool after every second one, then one FC classifier;
- ``mobilenet`` (:class:`MobileNetV1`): MobileNet v1, a standard 3x3 CONV then 13
  depthwise-separable blocks, global average pooling and one FC classifier.

``width`` scales the default filter counts (a width multiplier, each at least 1).
``ConvNet``'s ``head`` (:data:`CONVNET_HEADS`) is how its classifier reads the last
feature map: ``"flatten"`` (the paper's) or ``"flatten-scaled"``, the flattened map
divided by the square root of its positions, so the classifier's SGD step does not
grow with the image (issue 40; same weights and MACs).  They
hold no pruning rules: :func:`~.prunable.build_prunable` finds their prunable layers
with torch-pruning as it does for any user model (convnet: all six CONV layers;
mobilenet: the first CONV and the 13 pointwise CONVs, K = 14 as in the paper).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .base import image_spec, positive_float

__all__ = ["CONVNET_HEADS", "PRUNABLE_NETS", "ConvNet", "MobileNetV1"]

#: how :class:`ConvNet`'s classifier reads its last feature map (the first: the default)
CONVNET_HEADS = ("flatten", "flatten-scaled")


def _scaled(widths: Sequence[int], width: float) -> list[int]:
    scale = positive_float("width", width)
    return [max(1, round(w * scale)) for w in widths]


class _ConvUnit(nn.Module):
    def __init__(self, c_in: int, c_out: int, pool: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c_out)
        self.pool = nn.MaxPool2d(2) if pool else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        return self.pool(torch.relu(self.bn(self.conv(x))))


class _ImageNet(nn.Module):
    """A built-in image net: ``base_widths`` scaled by ``width``, built by ``_build``."""

    base_widths: tuple[int, ...] = ()

    def __init__(
        self,
        num_classes: int,
        in_channels: int,
        input_height: int,
        input_width: int,
        width: float = 1.0,
    ) -> None:
        super().__init__()
        image = image_spec(num_classes, in_channels, input_height, input_width)
        self._build(image, _scaled(self.base_widths, width))

    def _build(self, image: dict[str, int], widths: list[int]) -> None:
        raise NotImplementedError


class ConvNet(_ImageNet):
    """Simplified AlexNet ("ConvNet", DecNAS Table 2): 6 CONV layers, a max-pool after
    every second one (while the feature map is at least 2 px), then one FC layer.

    ``head="flatten-scaled"`` multiplies the flattened last map by ``1 / sqrt(H * W)``
    (its positions): the FC layer's input norm, and with it the size of its SGD step,
    then no longer grows with the image, the cause of the ConvNet's collapse at lr 0.05
    on 32x32 images (``benchmarks/lr_stability.py``, issue 40).  Same weights and MACs
    as ``"flatten"``."""

    base_widths = (32, 32, 64, 64, 128, 128)

    def __init__(
        self,
        num_classes: int,
        in_channels: int,
        input_height: int,
        input_width: int,
        width: float = 1.0,
        head: str = CONVNET_HEADS[0],
    ) -> None:
        if head not in CONVNET_HEADS:
            raise ValueError(f"ConvNet head {head!r}: allowed: {', '.join(CONVNET_HEADS)}")
        super().__init__(num_classes, in_channels, input_height, input_width, width)
        self.head = head
        positions = self.classifier.in_features // self.blocks[-1].conv.out_channels
        #: what the flattened map is multiplied by (1: the plain flatten head)
        self.head_scale = 1.0 / math.sqrt(positions) if head == "flatten-scaled" else 1.0

    def _build(self, image: dict[str, int], widths: list[int]) -> None:
        height, width_px = image["input_height"], image["input_width"]
        units, c_in = [], image["in_channels"]
        for layer, c_out in enumerate(widths):
            pool = layer % 2 == 1 and min(height, width_px) >= 2
            units.append(_ConvUnit(c_in, c_out, pool))
            if pool:
                height, width_px = height // 2, width_px // 2
            c_in = c_out
        self.blocks = nn.ModuleList(units)
        self.classifier = nn.Linear(c_in * height * width_px, image["num_classes"])

    def forward(self, x: Tensor) -> Tensor:
        for block in self.blocks:
            x = block(x)
        x = torch.flatten(x, 1)
        return self.classifier(x if self.head_scale == 1.0 else x * self.head_scale)


class _Separable(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.dw = nn.Conv2d(c_in, c_in, 3, stride, 1, groups=c_in, bias=False)
        self.dw_bn = nn.BatchNorm2d(c_in)
        self.pw = nn.Conv2d(c_in, c_out, 1, bias=False)
        self.pw_bn = nn.BatchNorm2d(c_out)

    def forward(self, x: Tensor) -> Tensor:
        x = torch.relu(self.dw_bn(self.dw(x)))
        return torch.relu(self.pw_bn(self.pw(x)))


class _Stem(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn = nn.BatchNorm2d(c_out)

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(self.bn(self.conv(x)))


class MobileNetV1(_ImageNet):
    """MobileNet v1 (Howard et al., 2017): CONV 3x3, 13 depthwise-separable blocks, GAP, FC.

    The stem's stride is 2 for inputs above 32 px and 1 otherwise (small images).
    """

    base_widths = (32, 64, 128, 128, 256, 256, 512, 512, 512, 512, 512, 512, 1024, 1024)
    strides = (1, 2, 1, 2, 1, 2, 1, 1, 1, 1, 1, 2, 1)

    def _build(self, image: dict[str, int], widths: list[int]) -> None:
        stem_stride = 2 if min(image["input_height"], image["input_width"]) > 32 else 1
        self.stem = _Stem(image["in_channels"], widths[0], stem_stride)
        self.blocks = nn.ModuleList(
            _Separable(c_in, c_out, stride)
            for c_in, c_out, stride in zip(widths[:-1], widths[1:], self.strides, strict=True)
        )
        self.classifier = nn.Linear(widths[-1], image["num_classes"])

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.classifier(x.mean(dim=(2, 3)))  # global average pool (CUDA-deterministic)


PRUNABLE_NETS: dict[str, type[nn.Module]] = {"convnet": ConvNet, "mobilenet": MobileNetV1}
"""The built-in prunable nets by their short names (run config ``decnas.model``)."""
