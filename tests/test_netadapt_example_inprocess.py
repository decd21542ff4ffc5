"""The netadapt example's own data, model, ServerApp and ClientApp code on the in-process
grid (no engine): DecNAS prunes the example's ``ShapesNet`` to at most its target of the
MACs, and the pruned model still classifies the lines far above chance."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedorasflwr.inprocess import InProcessGrid
from tests.netadapt_example import LAYERS, check_result, import_example, run_config

import_example()

from shapesprune.client_app import app  # noqa: E402 - needs the example on sys.path
from shapesprune.data import NUM_CLASSES, partition  # noqa: E402
from shapesprune.server_app import save, search  # noqa: E402

CHANCE = 1 / NUM_CLASSES


def test_each_node_makes_its_own_skewed_samples():
    train, val, test = partition(0, 1, 400, 0.5)
    assert (len(train), len(val), len(test)) == (320, 40, 40)
    assert train.tensors[0].shape[1:] == (1, 12, 12) and train.tensors[0].dtype == torch.float32
    counts = np.bincount(train.tensors[1].numpy(), minlength=NUM_CLASSES)
    assert counts.argmax() == 1  # node 1's own class, twice as likely as each other one
    again, _, _ = partition(0, 1, 400, 0.5)
    assert torch.equal(again.tensors[0], train.tensors[0])  # the same in every process
    other, _, _ = partition(0, 2, 400, 0.5)
    assert not torch.equal(other.tensors[0], train.tensors[0])
    with pytest.raises(ValueError, match="partition-id -1"):
        partition(0, -1, 400, 0.5)


def test_decnas_prunes_the_example_model_and_keeps_it_accurate(tmp_path):
    out = tmp_path / "out"
    config = run_config(**{"output-dir": str(out)})  # the pyproject's defaults
    grid = InProcessGrid(app, config, 4, node_configs={pid: {"num-threads": 1} for pid in range(4)})
    net, result = search(grid, config)
    assert list(net.layer_names()) == LAYERS
    found = save(net, result, out)
    checked, fresh_accuracy = check_result(out, config)
    assert checked == found
    final = found["final"]
    # the method's point: a third or less of the MACs, and accurate (4 classes: chance 0.25)
    assert final["macs-fraction"] <= config["decnas.target"]
    assert final["test-accuracy"] >= CHANCE + 0.5, found
    assert fresh_accuracy >= CHANCE + 0.5, fresh_accuracy  # model.pt, on a node never seen
