"""A model class the clients cannot import is refused when a strategy is built.

Clients rebuild a space or net from its class's import path (``spec["name"]``); a class
defined inside a function would fail on every client in the first round. Each strategy
refuses it at construction, before any message, naming the class and what to do."""

from __future__ import annotations

import pytest
import torch

from fedorasflwr.config import parse_run_config
from fedorasflwr.search_spaces import (
    CNNSmallSpace,
    DartsSpace,
    PrunableNet,
    build_prunable,
    require_importable,
)
from fedorasflwr.search_spaces.prunable_nets import ConvNet
from fedorasflwr.strategies import CFDNAS, DPFNAS, FDNAS, DecNAS, FedorAS
from tests.runconfig import pyproject_run_config
from tests.strategies.test_fdnas_user_space import TinyGatedSpace

INSIDE = r"<locals>.Local is defined inside a function .*define the class at the top level"


class _Settings:
    """Each method's settings from the project's run config (its ``method_settings``)."""

    def __getattr__(self, method: str):
        config = {**pyproject_run_config(), "method": method}
        return parse_run_config(config).method_settings


@pytest.fixture(scope="module")
def settings():
    return _Settings()


def _local_cnn() -> CNNSmallSpace:
    class Local(CNNSmallSpace):
        pass

    return Local(num_classes=10, in_channels=1, input_height=8, input_width=8)


def test_fedoras_refuses_a_space_defined_in_a_function(settings):
    with pytest.raises(ValueError, match=rf"FedorAS: the clients cannot import .*{INSIDE}"):
        FedorAS(space=_local_cnn(), settings=settings.fedoras, seed=0)


@pytest.mark.parametrize("cls", [FDNAS, CFDNAS])
def test_fdnas_and_cfdnas_refuse_a_space_defined_in_a_function(settings, cls):
    class Local(TinyGatedSpace):
        pass

    with pytest.raises(ValueError, match=rf"{cls.__name__}: the clients cannot import .*{INSIDE}"):
        cls(space=Local(), settings=settings.fdnas, seed=0)


def test_dpfnas_refuses_a_space_defined_in_a_function(settings):
    class Local(DartsSpace):
        pass

    torch.manual_seed(0)
    space = Local(channels=2, cells=2, input_height=28, input_width=28, stem_stride=2)
    with pytest.raises(ValueError, match=rf"DP-FNAS: the clients cannot import .*{INSIDE}"):
        DPFNAS(space=space, settings=settings.dpfnas, seed=0)


def test_decnas_refuses_a_net_whose_class_is_defined_in_a_function(settings):
    class Local(ConvNet):
        pass

    with pytest.raises(ValueError, match=INSIDE):  # build_prunable refuses it already
        build_prunable(Local, num_classes=10, in_channels=1, input_height=8, input_width=8)
    built = build_prunable("convnet", num_classes=10, in_channels=1, input_height=8, input_width=8)
    model = Local(num_classes=10, in_channels=1, input_height=8, input_width=8)
    net = PrunableNet(  # built by hand, around build_prunable's check
        model,
        name=f"{Local.__module__}:{Local.__qualname__}",
        kwargs=built.kwargs,
        input_shape=built.input_shape,
        layout=built.layout,
        widths=built.widths,
    )
    with pytest.raises(ValueError, match=rf"DecNAS: the clients cannot import .*{INSIDE}"):
        DecNAS(net=net, settings=settings.decnas, seed=0)


def test_a_spec_name_of_another_class_is_refused():
    space = CNNSmallSpace(num_classes=10, in_channels=1, input_height=8, input_width=8)
    space._spec["name"] = "fedorasflwr.search_spaces.cnn:CNNLargeSpace"
    with pytest.raises(ValueError, match=r"does not name the model's class"):
        require_importable(space, "FedorAS")


def test_top_level_and_built_in_classes_pass():
    require_importable(CNNSmallSpace(num_classes=10), "FedorAS")
    require_importable(TinyGatedSpace(), "FDNAS")
    net = build_prunable("convnet", num_classes=10, in_channels=1, input_height=8, input_width=8)
    require_importable(net, "DecNAS")
