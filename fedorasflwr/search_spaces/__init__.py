"""Search spaces: supernets with labelled choices, per-option costs and keys.

``build_space(name, **kwargs)`` builds a registered space (``cnn_l``, ``cnn_s``,
``rnn``, ``mbconv``, ``darts``) or any ``SearchSpace`` subclass by its import path
(``"mypkg.space:MySpace"``); ``build_space(**space.spec)`` rebuilds the same structure.
``build_prunable(MyNet, input_shape=..., **kwargs)`` wraps any ``nn.Module`` class of
conv/linear layers for DecNAS (``"convnet"`` / ``"mobilenet"``: the built-ins);
``load_prunable(net.spec, state_dict)`` rebuilds one with its weights.
"""

from .base import (
    SPACES,
    Cost,
    LayerChoice,
    MixedOp,
    SearchSpace,
    Subnet,
    Subspace,
    build_space,
    class_path,
    import_class,
    register_space,
)
from .cnn import CNNLargeSpace, CNNSmallSpace, cnn_l, cnn_s
from .darts import DartsSpace, DerivedNetwork, Genotype
from .mbconv import MBConvSpace, mbconv
from .prunable import PrunableNet, build_prunable, load_prunable
from .rnn import RNNSpace, rnn

__all__ = [
    "SPACES",
    "CNNLargeSpace",
    "CNNSmallSpace",
    "DartsSpace",
    "DerivedNetwork",
    "Genotype",
    "Cost",
    "LayerChoice",
    "MBConvSpace",
    "MixedOp",
    "PrunableNet",
    "RNNSpace",
    "SearchSpace",
    "Subnet",
    "Subspace",
    "build_prunable",
    "build_space",
    "class_path",
    "cnn_l",
    "cnn_s",
    "import_class",
    "load_prunable",
    "mbconv",
    "register_space",
    "rnn",
]
