"""The digits example's own ServerApp and ClientApp code on the in-process grid (no engine):
its split, then a whole FedorAS run (all three stages) and what its ServerApp writes."""

from __future__ import annotations

import numpy as np
import torch

from fedorasflwr.inprocess import InProcessGrid
from tests.digits_example import check_result, import_example, run_config

import_example()

from digitsnas.client_app import app  # noqa: E402 - needs the example on sys.path
from digitsnas.data import partition, split  # noqa: E402
from digitsnas.server_app import save, search, summary  # noqa: E402


def test_split_is_disjoint_and_covers_every_digit():
    server, parts = split(1797, 0, 0.15, 4)
    every = np.concatenate([server] + [indices for part in parts for indices in part])
    assert sorted(every) == list(range(1797))  # each digit once: no node sees another's
    assert len(server) == 270 and all(len(indices) > 0 for part in parts for indices in part)
    train, val, test = partition(0, 0.15, 3, 4)
    assert (len(train), len(val), len(test)) == tuple(len(i) for i in parts[3])
    assert train.tensors[0].shape[1:] == (1, 8, 8) and train.tensors[0].dtype == torch.float32
    assert set(train.tensors[1].tolist()) <= set(range(10))


def test_whole_run_on_the_in_process_grid(tmp_path):
    out = tmp_path / "out"
    config = run_config(**{"output-dir": str(out), "num-server-rounds": 2})
    grid = InProcessGrid(app, config, 4, node_configs={pid: {"num-threads": 1} for pid in range(4)})
    space, result = search(grid, config)
    found = save(space, result, out)
    assert check_result(out, config) == found
    # seeded throughout (split, supernet weights, FedorAS): the same run finds the same
    grid = InProcessGrid(app, config, 4, node_configs={pid: {"num-threads": 1} for pid in range(4)})
    assert summary(*search(grid, config)) == found
