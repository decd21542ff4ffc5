"""The rounds rule (issue 40, ``fedorasflwr.rounds``): every round key of the running
method times max(1, MNIST-5k's client rows / the dataset's), by hand on an image folder; 1 on
MNIST-5k, on text, with sampled partitions; DP-FNAS's private iterations never; a number
as given; bad values refused naming the key; and a run through the ServerApp records it."""

from __future__ import annotations

import json
import logging

import pytest
from flwr.app import Context, RecordDict

from fedorasflwr.client_app import app as client_app
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.rounds import RULE_KEYS, client_rows, parse_with_rounds_rule
from fedorasflwr.server_app import main
from tests.runconfig import pyproject_run_config
from tests.strategies.test_widths import tiny as tiny_widths


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    """An image folder of 6 classes x 30 shapes: 180 images."""
    from fedorasflwr.data.shapes import write_shapes

    return f"folder:{write_shapes(tmp_path_factory.mktemp('shapes') / 's', 30, seed=0)}"


def rule_of(**overrides):
    settings = parse_with_rounds_rule({**pyproject_run_config(), **overrides})
    return settings, settings.rounds_rule


def test_mnist5k_keeps_every_round_as_set():
    for method in RULE_KEYS:
        settings, rule = rule_of(method=method)
        assert rule["setting"] == "auto" and rule["scale"] == 1.0, method
        assert rule["rows"] == rule["reference_rows"] == 4500  # 5,000 less the 10% slice
        assert all(set_ == run for set_, run in rule["rounds"].values()), method
        assert settings.values == parse_with_rounds_rule(settings.values).values


def test_an_image_folder_gets_the_steps_mnist5k_gives(folder):
    # 180 images, 10% to the server: 162 client rows; MNIST-5k: 4,500. Scale 27.78.
    settings, rule = rule_of(**{"data.dataset": folder})
    assert (rule["rows"], rule["reference_rows"]) == (162, 4500)
    assert rule["scale"] == pytest.approx(4500 / 162)
    # pyproject's fedoras.rounds 8, finetune-rounds 5, rand-init-rounds 0 (off: stays 0)
    assert rule["rounds"] == {
        "fedoras.rounds": [8, 223],  # 8 x 27.78 = 222.2, rounded up
        "fedoras.finetune-rounds": [5, 139],  # 138.9
        "fedoras.rand-init-rounds": [0, 0],
    }
    method = settings.method_settings
    assert (method.train.rounds, method.finetune.rounds) == (223, 139)
    assert settings.values["fedoras.rounds"] == 223  # what a checkpoint binds
    # with the global test set carved from both: 162 - 16 = 146 against 10 x (450 - 45)
    _, rule = rule_of(**{"data.dataset": folder, "data.global-test": True})
    assert (rule["rows"], rule["reference_rows"]) == (146, 4050)
    assert rule["rounds"]["fedoras.rounds"] == [8, 222]  # 8 x 27.74 = 221.9
    assert client_rows(parse_with_rounds_rule({"data.dataset": folder}).data) == 162


def test_dpfnas_private_iterations_are_never_scaled(folder):
    settings, rule = rule_of(method="dpfnas", **{"data.dataset": folder})
    assert "dpfnas.iterations" not in rule["rounds"]
    assert settings.method_settings.iterations == pyproject_run_config()["dpfnas.iterations"]
    assert rule["rounds"]["dpfnas.final-rounds"] == [5, 139]


def test_text_sampled_partitions_and_a_number(folder):
    text = {"data.dataset": "pydoc-topics", "data.partitioner": "natural", "space.name": "rnn"}
    _, rule = rule_of(**text)
    assert rule["scale"] == 1.0 and "text" in rule["why"]
    sampled = {"data.dataset": folder, "data.partitioner": "sampled", "data.partition-size": 8}
    _, rule = rule_of(**sampled)
    assert rule["scale"] == 1.0 and "sampled" in rule["why"]
    settings, rule = rule_of(**{"rounds-scale": 2.5})  # a number: on any data, as given
    assert rule["scale"] == 2.5 and rule["rounds"]["fedoras.rounds"] == [8, 20]
    assert rule["rounds"]["fedoras.finetune-rounds"] == [5, 13]  # 12.5 rounded up
    _, rule = rule_of(**{"rounds-scale": 1})
    assert rule["scale"] == 1.0 and rule["why"] == "rounds-scale as set"
    _, rule = rule_of(method="cfdnas", **{"rounds-scale": 3, "fdnas.final-rounds": 0})
    assert rule["rounds"]["fdnas.final-rounds"] == [0, 0]  # a stage that is off stays off
    assert (
        rule["rounds"]["fdnas.cluster-rounds"][1] == 3 * rule["rounds"]["fdnas.cluster-rounds"][0]
    )


@pytest.mark.parametrize("value", ["fast", "Auto", 0, -1.5, True, float("nan")])
def test_a_bad_scale_is_refused_naming_the_key(value):
    with pytest.raises(ValueError, match=r"'rounds-scale'") as caught:
        parse_with_rounds_rule({**pyproject_run_config(), "rounds-scale": value})
    if value not in (True,) and not (isinstance(value, float) and value != value):
        assert '"auto"' in str(caught.value)


def test_the_serverapp_runs_the_scaled_rounds_and_records_the_rule(tmp_path, data_cache, caplog):
    # HeteroFL's tiny run, 1 round as set, x2: two rounds run, the rule in result.json
    config = {**tiny_widths(data_cache, "heterofl"), "rounds-scale": 2.0}
    config["output-dir"] = str(tmp_path)
    context = Context(run_id=3, node_id=0, node_config={}, state=RecordDict(), run_config=config)
    with caplog.at_level(logging.INFO, logger="flwr"):
        main(InProcessGrid(client_app, config, 4), context)
    (result_file,) = tmp_path.glob("heterofl-*/result.json")
    result = json.loads(result_file.read_text())
    rounds = config["heterofl.rounds"]
    assert result["settings"]["rounds_rule"]["rounds"] == {"heterofl.rounds": [rounds, 2 * rounds]}
    assert result["settings"]["heterofl"]["train"]["rounds"] == 2 * rounds
    assert len([h for h in result["history"] if h.get("round", 0) >= 1]) == 2 * rounds
    assert f"heterofl.rounds {rounds} -> {2 * rounds}" in caplog.text


def test_the_leaderboard_lists_the_rounds_the_rule_ran(tmp_path):
    from fedorasflwr.compare.cli import _entry
    from fedorasflwr.compare.execute import MethodRun

    rule = {"scale": 2.78, "why": "auto: 4050 / 1458", "rounds": {"fjord.rounds": [12, 34]}}
    document = {"settings": {"rounds_rule": rule}, "seconds": 1.0}
    done = MethodRun("fjord", "run", "finished", document, tmp_path / "r.json")
    entry = _entry({"method": "fjord", "rounds": {"fjord.rounds": 12}}, done, tmp_path, "", None)
    assert entry["rounds"] == {"fjord.rounds": 34}
    assert entry["note"] == "rounds x2.78 by the rounds rule (auto: 4050 / 1458)"
    unscaled = {"settings": {"rounds_rule": {**rule, "scale": 1.0}}, "seconds": 1.0}
    done = MethodRun("fjord", "run", "finished", unscaled, tmp_path / "r.json")
    entry = _entry({"method": "fjord", "rounds": {"fjord.rounds": 12}}, done, tmp_path, "x", None)
    assert entry["rounds"] == {"fjord.rounds": 12} and entry["note"] == "x"


def test_compare_rounds_n_runs_exactly_n_on_any_data(folder):
    """``[compare] rounds = N`` (``--rounds N``) is every round key at N, exactly: the
    rounds rule does not multiply it again on a small folder."""
    from fedorasflwr.compare.spec import app_run_config, read_spec, with_rounds
    from tests.runconfig import ROOT

    flags = {"methods": "fjord", "reference": "fjord", "rounds": 7, "dataset": folder}
    spec = read_spec(None, flags, ROOT)
    config = {**app_run_config(ROOT), **with_rounds(spec, "fjord", spec.run_config("fjord"))}
    settings = parse_with_rounds_rule(config)
    assert settings.rounds_rule["rounds"] == {"fjord.rounds": [7, 7]}
    assert settings.rounds_rule["why"] == "rounds-scale as set"
    # without [compare] rounds: each method's own rounds, with the rule
    spec = read_spec(None, {**flags, "rounds": None}, ROOT)
    config = {**app_run_config(ROOT), **with_rounds(spec, "fjord", spec.run_config("fjord"))}
    assert parse_with_rounds_rule(config).rounds_rule["scale"] > 1
