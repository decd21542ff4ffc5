"""DecNAS on a user's own nn.Module (residual, concatenation, linear layers) on the in-process
grid: the clients rebuild it from its import path and the frontier shrinks."""

from __future__ import annotations

import pytest
import torch
from flwr.app import ArrayRecord, MetricRecord

from fedorasflwr.client_app import app as client_app
from fedorasflwr.config import parse_run_config
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.methods.decnas.strategy import DecNAS
from fedorasflwr.protocol import CONFIG
from fedorasflwr.search_spaces.prunable import build_prunable
from tests.runconfig import tiny_decnas
from tests.search_spaces.test_prunable_user import TinyResNet

PATH = "tests.search_spaces.test_prunable_user:TinyResNet"


def test_decnas_prunes_a_user_model_rebuilt_by_the_clients_from_its_import_path(data_cache):
    config = tiny_decnas(data_cache, **{"decnas.gm0-rounds": 0, "decnas.final-rounds": 0})
    settings = parse_run_config(config)
    torch.manual_seed(0)
    net = build_prunable(
        TinyResNet,
        input_shape=(1, 28, 28),
        num_classes=10,
        stem=8,
        branches=[8, 8],
        mix=16,
        hidden=16,
    )
    strategy = DecNAS(net=net, settings=settings.method_settings, seed=settings.seed)
    grid = InProcessGrid(client_app, config, 6)
    seen = []
    probe = torch.zeros((2, 1, 28, 28))

    def evaluate(t, arrays, model):  # issue 43: GM_t comes with its arrays
        net_t = model.net()
        assert list(net_t.widths) == model.widths
        seen.append((t, model.widths, float(net_t(probe).sum()), sorted(arrays.keys())))
        return MetricRecord({"probe": float(net_t(probe).sum())})

    result = strategy.start(grid, ArrayRecord(net.state_dict()), num_rounds=1, evaluate_fn=evaluate)
    gm0, gm1 = result.frontier
    # one call per GM_t, each with that GM_t's widths and weights (the pruned shapes)
    assert [(t, w) for t, w, _, _ in seen] == [(0, gm0.widths), (1, gm1.widths)]
    assert [keys for *_, keys in seen] == [sorted(gm0.arrays.keys()), sorted(gm1.arrays.keys())]
    assert result.evaluate_metrics_serverapp[1]["probe"] == seen[1][2]
    assert gm0.widths == [8, 8, 8, 16, 16]
    assert gm1.macs <= gm1.budget < gm0.macs
    assert sum(gm1.widths) < sum(gm0.widths)
    assert result.history[0]["accuracy"]  # candidates were tuned and scored by the clients
    configs = [m.content.config_records[CONFIG] for m in grid.sent if CONFIG in m.content]
    assert {c["space.name"] for c in configs if "space.name" in c} == {PATH}
    assert gm0.test_accuracy is not None and gm1.test_accuracy is not None


def test_a_bare_module_is_refused_with_how_to_wrap_it(data_cache):
    settings = parse_run_config(tiny_decnas(data_cache))
    with pytest.raises(TypeError, match="build_prunable"):
        DecNAS(net=TinyResNet(), settings=settings.method_settings, seed=0)


def test_a_two_argument_evaluate_fn_gets_flowers_two_arguments():
    from fedorasflwr.methods.decnas.strategy import takes_model

    assert not takes_model(lambda t, arrays: None)
    assert takes_model(lambda t, arrays, model: None)
    assert takes_model(lambda t, arrays, *, model=None: None)
    assert takes_model(lambda t, arrays, **kwargs: None)
    assert not takes_model(print)  # no model keyword: Flower's two arguments
