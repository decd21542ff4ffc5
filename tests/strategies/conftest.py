"""Fixtures shared by the DP-FNAS mechanism and secrecy tests (a test module may override them)."""

from __future__ import annotations

import pytest
import torch

from fedorasflwr.config import parse_run_config
from fedorasflwr.data import load_client_data
from fedorasflwr.search_spaces import build_space
from tests.runconfig import pyproject_run_config


@pytest.fixture(scope="module")
def space():
    """A tiny darts supernet, initialised from seed 0."""
    torch.manual_seed(0)
    return build_space("darts", channels=2, cells=2, input_height=28, input_width=28, stem_stride=2)


@pytest.fixture(scope="module")
def client_data(data_cache):
    """Partition 0 of 60 of MNIST-5k (iid)."""
    config = pyproject_run_config()
    config.update({"data.cache-dir": str(data_cache), "data.partitioner": "iid"})
    return load_client_data(parse_run_config(config).data, 0, 60)
