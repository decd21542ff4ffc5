"""The example's own model: a plain ``nn.Module`` of conv and linear layers, which DecNAS
prunes filter by filter.

Nothing in it knows about DecNAS: the ServerApp wraps it with
``build_prunable(ShapesNet, input_shape=(1, 12, 12), ...)``, which finds its prunable
layers (``features.0``, ``features.3``, ``features.7``, ``classifier.0``; the last linear
layer's outputs are the classes and stay). It sits at the top level of an importable
module: the clients rebuild it from its import path, ``shapesprune.model:ShapesNet``.
"""

from __future__ import annotations

from torch import Tensor, nn


class ShapesNet(nn.Module):
    """Three 3x3 conv layers (``width``, ``2 width``, ``2 width`` filters, BatchNorm, ReLU,
    a 2x2 max-pool after the second), a global max-pool, then two linear layers."""

    def __init__(self, num_classes: int = 4, width: int = 16, hidden: int = 32) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1, bias=False),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(2 * width, 2 * width, 3, padding=1, bias=False),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.AdaptiveMaxPool2d(1),
            nn.Flatten(),
        )
        self.classifier = nn.Sequential(
            nn.Linear(2 * width, hidden), nn.ReLU(), nn.Linear(hidden, num_classes)
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))
