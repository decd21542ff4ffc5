"""The FedorAS next-character search space ``rnn`` (Shakespeare).

FedorAS paper, App. E.3 and Fig. 7 right (after FjORD's model): a fixed
embedding (8 features per character), searchable op#1 (8 -> H) in parallel
with searchable skip#1, their sum into searchable op#2 (H -> H) in parallel
with searchable skip#2, their sum into a linear layer over the vocabulary at
every time step.  H = 128 x ``width``.  Unidirectional and causal, no
normalisation.  The cost table is measured on one sequence of ``seq_len``
tokens; see :mod:`.ops` for why the recurrent cells are hand-written.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .base import MixedOp, SearchSpace, positive_float, positive_int, register_space
from .ops import RNN_OPS, make_op

__all__ = ["OP_OPTIONS", "RNNSpace", "rnn"]

OP_OPTIONS = ("lstm", "gru", "ligru", "qrnn", "linear", "conv1d_k5")
"""Options shared by all four layers (paper: LSTM, GRU, LiGRU, QRNN, Linear, Conv k5)."""

LAYER_OPTIONS = {
    "op1": OP_OPTIONS,
    "skip1": (*OP_OPTIONS, "zero"),
    "op2": (*OP_OPTIONS, "identity"),
    "skip2": (*OP_OPTIONS, "identity", "zero"),
}
"""Per searchable layer: identity only where the shapes match, zero only on skips."""


class RecurrentSupernet(nn.Module):
    """Embedding -> (op1 + skip1) -> (op2 + skip2) -> linear over the vocabulary."""

    def __init__(self, vocab_size: int, embed_dim: int, hidden_size: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        for label, options in LAYER_OPTIONS.items():
            in_features = embed_dim if label in ("op1", "skip1") else hidden_size
            self.add_module(
                label,
                MixedOp(
                    {name: make_op(RNN_OPS, name, in_features, hidden_size) for name in options}
                ),
            )
        self.classifier = nn.Linear(hidden_size, vocab_size)

    def forward(self, x: Tensor, arch: Sequence[int]) -> Tensor:
        embedded = self.embedding(x)
        y = self.op1(embedded, arch[0]) + self.skip1(embedded, arch[1])
        z = self.op2(y, arch[2]) + self.skip2(y, arch[3])
        return self.classifier(z)


@register_space
class RNNSpace(SearchSpace):
    """``rnn``: the FedorAS Shakespeare space; input token ids ``(B, T)``, logits ``(B, T, V)``."""

    name = "rnn"

    def __init__(
        self,
        vocab_size: int = 90,
        seq_len: int = 80,
        width: float = 1.0,
        embed_dim: int = 8,
    ) -> None:
        spec = {
            "vocab_size": positive_int("vocab_size", vocab_size),
            "seq_len": positive_int("seq_len", seq_len),
            "width": positive_float("width", width),
            "embed_dim": positive_int("embed_dim", embed_dim),
        }
        hidden_size = max(4, round(128 * spec["width"]))
        net = RecurrentSupernet(spec["vocab_size"], spec["embed_dim"], hidden_size)
        super().__init__(net, input_shape=(spec["seq_len"],), input_dtype=torch.int64, spec=spec)
        self.hidden_size = hidden_size


rnn = RNNSpace
"""Alias: ``rnn(vocab_size=90, ...)`` reads like the design table."""
