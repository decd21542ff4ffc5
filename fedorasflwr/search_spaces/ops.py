"""Candidate operations: name -> factory tables (DARTS ``OPS`` style).

``CONV_OPS[name](channels)`` builds a shape-preserving image op (FedorAS paper
App. E.3, CIFAR and Speech Commands spaces); ``RNN_OPS[name](in_features,
hidden_size)`` builds a sequence op mapping ``(B, T, in)`` to ``(B, T, hidden)``
(Shakespeare space).  Every convolution is followed by BatchNorm and ReLU,
except the linear projection closing an MBConv.

The recurrent cells are written with ``nn.Linear`` / explicit matmuls and a
Python loop over time instead of ``nn.LSTM`` / ``nn.GRU``: on CPU,
``FlopCounterMode`` counts **zero** FLOPs for ``nn.LSTM`` (its fused kernel is
not in the FLOP registry), and one implementation for every cell keeps the
counts comparable.  Per sample a cell with ``g`` gates costs
``2 * T * g * hidden * (in + hidden)`` FLOPs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "CONV_OPS",
    "RNN_OPS",
    "CausalConvSigmoid",
    "ConvNormAct",
    "DepthwiseSeparableConv",
    "GRULayer",
    "LSTMLayer",
    "LiGRULayer",
    "LinearSigmoid",
    "MobileBottleneck",
    "QRNNLayer",
    "SqueezeExcite",
    "Zero",
    "make_op",
]


def make_op(table: Mapping[str, Callable[..., nn.Module]], name: str, *args: int) -> nn.Module:
    """Build ``table[name](*args)``; unknown names raise ``ValueError`` listing the valid ones."""
    if name not in table:
        raise ValueError(f"unknown operation {name!r}; valid: {', '.join(table)}")
    return table[name](*args)


# ----------------------------------------------------------------- images
class ConvNormAct(nn.Module):
    """Conv2d (no bias) + BatchNorm2d + optional ReLU; odd kernels keep the size at stride 1."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        *,
        stride: int = 1,
        groups: int = 1,
        activation: bool = True,
        padding: int | None = None,
    ) -> None:
        super().__init__()
        padding = kernel_size // 2 if padding is None else padding
        self.conv = nn.Conv2d(
            in_channels, out_channels, kernel_size, stride, padding, groups=groups, bias=False
        )
        self.norm = nn.BatchNorm2d(out_channels)
        self.act = nn.ReLU() if activation else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        return self.act(self.norm(self.conv(x)))


class SqueezeExcite(nn.Module):
    """Squeeze-and-Excitation: channel gates from globally pooled features."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        # Full-width squeeze, as in the FedorAS reference code.
        self.reduce = nn.Conv2d(channels, channels, 1)
        self.expand = nn.Conv2d(channels, channels, 1)

    def forward(self, x: Tensor) -> Tensor:
        gate = self.expand(F.relu(self.reduce(x.mean((2, 3), keepdim=True))))
        return x * torch.sigmoid(gate)


class DepthwiseSeparableConv(nn.Module):
    """Residual DSConv: grouped k x k conv to ``expansion * C`` channels, then 1x1 back to C.

    ``groups = gcd(C, expansion * C)``: depthwise for expansion >= 1, pairs of
    input channels per output for expansion 0.5 (the reference code's choice).
    """

    def __init__(self, channels: int, kernel_size: int, expansion: float) -> None:
        super().__init__()
        expanded = max(1, int(channels * expansion))
        self.depthwise = ConvNormAct(
            channels, expanded, kernel_size, groups=math.gcd(channels, expanded)
        )
        self.pointwise = ConvNormAct(expanded, channels, 1)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.pointwise(self.depthwise(x))


class MobileBottleneck(nn.Module):
    """Residual MBConv+SE: k x k conv to ``expansion * C``, SE, linear 1x1 projection to C."""

    def __init__(self, channels: int, kernel_size: int, expansion: float) -> None:
        super().__init__()
        expanded = max(1, int(channels * expansion))
        self.expand = ConvNormAct(channels, expanded, kernel_size)
        self.excite = SqueezeExcite(expanded)
        self.project = ConvNormAct(expanded, channels, 1, activation=False)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.project(self.excite(self.expand(x)))


def _conv(channels: int, kernel_size: int) -> nn.Module:
    return ConvNormAct(channels, channels, kernel_size)


def _identity(*_: int) -> nn.Module:
    return nn.Identity()


CONV_OPS: dict[str, Callable[[int], nn.Module]] = {
    "conv1x1": partial(_conv, kernel_size=1),
    "conv3x3": partial(_conv, kernel_size=3),
    "dsconv1x1_e2": partial(DepthwiseSeparableConv, kernel_size=1, expansion=2),
    "dsconv3x3_e0.5": partial(DepthwiseSeparableConv, kernel_size=3, expansion=0.5),
    "dsconv3x3_e1": partial(DepthwiseSeparableConv, kernel_size=3, expansion=1),
    "dsconv3x3_e2": partial(DepthwiseSeparableConv, kernel_size=3, expansion=2),
    "mbconv_k1_e2": partial(MobileBottleneck, kernel_size=1, expansion=2),
    "mbconv_k3_e0.5": partial(MobileBottleneck, kernel_size=3, expansion=0.5),
    "mbconv_k3_e1": partial(MobileBottleneck, kernel_size=3, expansion=1),
    "mbconv_k3_e2": partial(MobileBottleneck, kernel_size=3, expansion=2),
    "identity": _identity,
}
"""Shape-preserving image ops, ``factory(channels)``."""


# -------------------------------------------------------------- sequences
class LSTMLayer(nn.Module):
    """Unidirectional LSTM, zero initial state, batch-first."""

    gates = 4
    hidden_bias = False

    def __init__(self, in_features: int, hidden_size: int) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.input_proj = nn.Linear(in_features, self.gates * hidden_size)
        self.hidden_proj = nn.Linear(hidden_size, self.gates * hidden_size, bias=self.hidden_bias)

    def forward(self, x: Tensor) -> Tensor:
        projected = self.input_proj(x)  # all time steps in one matmul
        h = x.new_zeros(x.shape[0], self.hidden_size)
        c = torch.zeros_like(h)
        outputs = []
        for t in range(x.shape[1]):
            gates = projected[:, t] + self.hidden_proj(h)
            sig = torch.sigmoid(gates[:, : 3 * self.hidden_size])
            i, f, o = sig.chunk(3, dim=1)
            c = f * c + i * torch.tanh(gates[:, 3 * self.hidden_size :])
            h = o * torch.tanh(c)
            outputs.append(h)
        return torch.stack(outputs, dim=1)


class GRULayer(LSTMLayer):
    """Unidirectional GRU (PyTorch's equations, reset gate applied after the matmul)."""

    gates = 3
    hidden_bias = True  # the reset gate multiplies the hidden bias too

    def forward(self, x: Tensor) -> Tensor:
        projected = self.input_proj(x)
        h = x.new_zeros(x.shape[0], self.hidden_size)
        split = 2 * self.hidden_size
        outputs = []
        for t in range(x.shape[1]):
            px, ph = projected[:, t], self.hidden_proj(h)
            r, z = torch.sigmoid(px[:, :split] + ph[:, :split]).chunk(2, dim=1)
            n = torch.tanh(px[:, split:] + r * ph[:, split:])
            h = n + z * (h - n)
            outputs.append(h)
        return torch.stack(outputs, dim=1)


class LiGRULayer(LSTMLayer):
    """Light GRU (Ravanelli et al., 2018): update gate only, tanh candidate, no normalisation."""

    gates = 2

    def forward(self, x: Tensor) -> Tensor:
        projected = self.input_proj(x)
        h = x.new_zeros(x.shape[0], self.hidden_size)
        outputs = []
        for t in range(x.shape[1]):
            gates = projected[:, t] + self.hidden_proj(h)
            z = torch.sigmoid(gates[:, self.hidden_size :])
            candidate = torch.tanh(gates[:, : self.hidden_size])
            h = candidate + z * (h - candidate)
            outputs.append(h)
        return torch.stack(outputs, dim=1)


class QRNNLayer(nn.Module):
    """Quasi-RNN (Bradbury et al., 2017): causal conv (width 2) gates + fo-pooling."""

    def __init__(self, in_features: int, hidden_size: int, kernel_size: int = 2) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.conv = nn.Conv1d(in_features, 3 * hidden_size, kernel_size)

    def forward(self, x: Tensor) -> Tensor:
        gates = self.conv(F.pad(x.transpose(1, 2), (self.kernel_size - 1, 0))).transpose(1, 2)
        z, f, o = gates.chunk(3, dim=2)
        z, f, o = torch.tanh(z), torch.sigmoid(f), torch.sigmoid(o)
        update = (1 - f) * z
        c = torch.zeros_like(z[:, 0])
        cells = []
        for t in range(x.shape[1]):
            c = f[:, t] * c + update[:, t]
            cells.append(c)
        return o * torch.stack(cells, dim=1)


class LinearSigmoid(nn.Module):
    """Per-step linear layer + sigmoid (no recurrence)."""

    def __init__(self, in_features: int, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, hidden_size)

    def forward(self, x: Tensor) -> Tensor:
        return torch.sigmoid(self.linear(x))


class CausalConvSigmoid(nn.Module):
    """Conv1d over time seeing the current and ``kernel_size - 1`` previous steps, + sigmoid."""

    def __init__(self, in_features: int, hidden_size: int, kernel_size: int = 5) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.conv = nn.Conv1d(in_features, hidden_size, kernel_size)

    def forward(self, x: Tensor) -> Tensor:
        y = self.conv(F.pad(x.transpose(1, 2), (self.kernel_size - 1, 0)))
        return torch.sigmoid(y).transpose(1, 2)


class Zero(nn.Module):
    """Zeros of shape ``(*x.shape[:-1], out_features)`` (a skip connection switched off)."""

    def __init__(self, out_features: int) -> None:
        super().__init__()
        self.out_features = out_features

    def forward(self, x: Tensor) -> Tensor:
        return x.new_zeros(*x.shape[:-1], self.out_features)


def _sequence_identity(in_features: int, hidden_size: int) -> nn.Module:
    if in_features != hidden_size:
        raise ValueError(
            f"identity needs in_features == hidden_size, got {in_features} -> {hidden_size}"
        )
    return nn.Identity()


def _zero(_in_features: int, hidden_size: int) -> nn.Module:
    return Zero(hidden_size)


RNN_OPS: dict[str, Callable[[int, int], nn.Module]] = {
    "lstm": LSTMLayer,
    "gru": GRULayer,
    "ligru": LiGRULayer,
    "qrnn": QRNNLayer,
    "linear": LinearSigmoid,
    "conv1d_k5": CausalConvSigmoid,
    "identity": _sequence_identity,
    "zero": _zero,
}
"""Sequence ops ``(B, T, in) -> (B, T, hidden)``, ``factory(in_features, hidden_size)``."""
