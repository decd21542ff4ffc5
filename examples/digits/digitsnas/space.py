"""The example's own search space: three searchable layers on 1x8x8 digits.

Not registered: the class sits at the top level of an importable module, so the clients
rebuild it from its import path (``space.spec["name"] == "digitsnas.space:DigitsSpace"``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from fedorasflwr.search_spaces import MixedOp, SearchSpace
from torch import Tensor, nn


def conv_bn(in_channels: int, out_channels: int, kernel: int, groups: int = 1) -> nn.Sequential:
    """Conv (same padding), BatchNorm, ReLU."""
    return nn.Sequential(
        nn.Conv2d(
            in_channels, out_channels, kernel, padding=kernel // 2, groups=groups, bias=False
        ),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


def sep_conv(channels: int, kernel: int) -> nn.Sequential:
    """Depthwise-separable conv: a depthwise ``kernel`` conv, then a 1x1 conv."""
    return nn.Sequential(
        conv_bn(channels, channels, kernel, groups=channels), conv_bn(channels, channels, 1)
    )


class DigitsNet(nn.Module):
    """Stem, two searchable layers at 8x8, a 2x2 pool, one searchable layer at 4x4, head."""

    def __init__(self, num_classes: int, width: int) -> None:
        super().__init__()
        self.stem = conv_bn(1, width, 3)
        self.layer1 = MixedOp(
            {
                "conv3x3": conv_bn(width, width, 3),
                "conv5x5": conv_bn(width, width, 5),
                "skip": nn.Identity(),
            }
        )
        self.layer2 = MixedOp(
            {
                "conv3x3": conv_bn(width, width, 3),
                "sepconv3x3": sep_conv(width, 3),
                "skip": nn.Identity(),
            }
        )
        self.pool = nn.MaxPool2d(2)
        self.layer3 = MixedOp(
            {
                "conv3x3": conv_bn(width, width, 3),
                "conv1x1": conv_bn(width, width, 1),
                "skip": nn.Identity(),
            }
        )
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, num_classes)
        )

    def forward(self, x: Tensor, arch: Sequence[int]) -> Tensor:
        x = self.stem(x)
        x = self.layer1(x, arch[0])
        x = self.layer2(x, arch[1])
        x = self.layer3(self.pool(x), arch[2])
        return self.head(x)


class DigitsSpace(SearchSpace):
    """27 paths: layers of 3 options each over ``width`` channels, on 1x8x8 inputs."""

    def __init__(self, num_classes: int = 10, width: int = 8) -> None:
        super().__init__(
            DigitsNet(num_classes, width),
            input_shape=(1, 8, 8),
            input_dtype=torch.float32,
            spec={"num_classes": num_classes, "width": width},
        )
