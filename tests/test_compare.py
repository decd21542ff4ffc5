"""``python -m fedorasflwr.compare`` on a tiny setting, in process: three methods (HeteroFL
with a model per tier, FjORD matched to its client training FLOPs, FedNAS with one model),
the leaderboard's files and rows checked against each run's result.json; resuming reuses
finished runs; a failing method is reported and stops no other; a bad comparison is refused
before anything runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fedorasflwr.compare import cli, execute, read_spec
from fedorasflwr.compare.cli import scaled_rounds
from fedorasflwr.compare.leaderboard import flag_near_chance, markdown, pareto
from fedorasflwr.config import known_keys
from fedorasflwr.methods import METHODS, ROUND_KEYS, points_function
from fedorasflwr.results import POINT_FIELDS
from tests.runconfig import ROOT

NODES = 4

#: every client on 64 rows of its own (the sampled partitioner, as tests.runconfig.FEW_ROWS):
#: FjORD's one round books half the reference's client training FLOPs and runs again scaled,
#: and so does FedNAS's (measured 2026-12-02: HeteroFL 1.95, FjORD 0.98 then 1.95, FedNAS 1.12
#: then 1.72 GFLOPs with 3 search and 2 final rounds; the comparison took 69 s alone on the
#: 2-core machine). With each client's IID share (about 1,100 rows) it booked 30.4 / 12.2 /
#: 27.4 GFLOPs, FedNAS ran once, and the fixture took 860 s of a CI worker's time
TINY = """
onnx = false

[data]
dataset = "mnist5k"
partitioner = "sampled"  # 64 rows per client (see above)
partition-size = 64
global-test = true
cache-dir = "{cache}"

[compare]
methods = ["heterofl", "fjord", "fednas"]
budget = "flops"
reference = "heterofl"
tolerance = 0.2
nodes = {nodes}

[methods.heterofl.heterofl]
widths = "0.125,0.25"
rounds = 2
clients-per-round = 2
local-epochs = 1
batch-size = 64

[methods.fjord.fjord]
widths = "0.125,0.25"
tier-widths = "0.125,0.25"
rounds = 1
clients-per-round = 2
local-epochs = 1
batch-size = 64

[methods.fednas]
space.name = "darts"
space.width = 0.25
space.layers-per-block = 1
fednas.rounds = 2
fednas.final-rounds = 1
fednas.batch-size = 64
"""


def write_tiny(path: Path, cache: Path, **replace: str) -> Path:
    text = TINY.format(cache=cache, nodes=NODES)
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def compared(tmp_path_factory, data_cache):
    """The tiny comparison, run once for the module's tests."""
    tmp = tmp_path_factory.mktemp("compare")
    config = write_tiny(tmp / "tiny.toml", data_cache)
    out = tmp / "out"
    code = cli.main(["--run-config", str(config), "--out", str(out), "--inprocess"])
    return code, config, out, json.loads((out / "leaderboard.json").read_text())


def ledger_sum(document: dict, key: str) -> int:
    return sum(stage["totals"][key] for stage in document["ledger"].values())


def by_method(content: dict) -> dict[str, dict]:
    return {m["method"]: m for m in content["methods"]}


def test_the_leaderboard_states_the_budget_and_has_a_row_per_model(compared) -> None:
    code, _config, out, content = compared
    assert code == 0
    assert {p.name for p in out.iterdir()} >= {
        "leaderboard.json",
        "leaderboard.md",
        "leaderboard.png",
        "heterofl",
        "fjord",
        "fednas",
    }
    assert content["budget"]["rule"] == "flops"
    assert content["budget"]["reference"] == "heterofl"
    assert "equal client training FLOPs" in content["budget"]["statement"]
    markdown = (out / "leaderboard.md").read_text()
    assert "**budget rule: flops**" in markdown
    assert "![accuracy against cost](leaderboard.png)" in markdown
    rows = content["rows"]
    assert sorted((r["method"], r["model"]) for r in rows) == [
        ("fednas", "derived"),
        ("fjord", "T1 w=0.125"),
        ("fjord", "T2 w=0.25"),
        ("heterofl", "T1 w=0.125"),
        ("heterofl", "T2 w=0.25"),
    ]
    assert sum(r["method"] == "fednas" for r in rows) == 1
    macs = [r["macs"] for r in rows]
    assert macs == sorted(macs)  # cheapest first
    assert rows[0]["best_at_cost"] is True  # the cheapest model is the best at its cost
    for row in rows:
        assert f"| {row['method']} | {row['model']} |" in markdown
        assert row["near_chance"] in (True, False)  # chance is known: every row judged
    assert content["chance"] == pytest.approx(0.1)


def test_every_number_is_the_run_s_own(compared) -> None:
    _code, _config, out, content = compared
    for method, entry in by_method(content).items():
        document = json.loads((out / entry["result"]).read_text())
        assert document["method"] == method and document["status"]["finished"] is True
        expected = [{"method": method, **p} for p in points_function(method)(document)]
        got = [
            {k: v for k, v in r.items() if k not in ("best_at_cost", "near_chance")}
            for r in content["rows"]
            if r["method"] == method
        ]
        assert sorted(got, key=lambda r: r["model"]) == sorted(expected, key=lambda r: r["model"])
        assert entry["bytes_up"] == ledger_sum(document, "bytes_up") > 0
        assert entry["bytes_down"] == ledger_sum(document, "bytes_down") > 0
        assert entry["run_seconds"] == document["seconds"]
        booked = ledger_sum(document, "train_flops")
        assert entry["client_train_flops"] == (booked or None)
    heterofl = json.loads((out / by_method(content)["heterofl"]["result"]).read_text())
    rows = {r["model"]: r for r in content["rows"] if r["method"] == "heterofl"}
    for tier in heterofl["tiers"]:
        row = rows[f"T{tier['tier']} w={tier['width']:g}"]
        assert row["global_test_accuracy"] == tier["global_test_accuracy"]
        assert row["test_accuracy"] == tier["test_accuracy"]
        assert row["macs"] == tier["macs"] and row["flops"] == 2 * tier["macs"]


def test_flops_budget_scales_the_rounds_towards_the_reference(compared) -> None:
    _code, _config, out, content = compared
    entries = by_method(content)
    reference = entries["heterofl"]["client_train_flops"]
    assert content["budget"]["reference_client_train_flops"] == reference > 0
    fjord = entries["fjord"]
    pilot = fjord["pilot_client_train_flops"]
    first = json.loads(next((out / "fjord" / "run").glob("fjord-*/result.json")).read_text())
    assert pilot == ledger_sum(first, "train_flops")
    # one FjORD round (widths sampled up to p_max) against two HeteroFL rounds: far below
    assert pilot / reference < 0.8
    assert fjord["rounds_as_set"] == {"fjord.rounds": 1}
    assert fjord["rounds"] == {"fjord.rounds": max(1, round(reference / pilot))}
    assert fjord["result"].startswith("fjord/scaled/")
    assert fjord["flops_ratio"] == fjord["client_train_flops"] / reference
    assert abs(fjord["flops_ratio"] - 1) < abs(pilot / reference - 1)
    # FedNAS books its clients' DARTS steps (3 x the mixed supernet's forward FLOPs per
    # sample) and the derived net's final training: measured like every other method
    fednas = entries["fednas"]
    document = json.loads((out / fednas["result"]).read_text())
    assert fednas["client_train_flops"] == ledger_sum(document, "train_flops") > 0
    assert document["ledger"]["search"]["totals"]["train_flops"] > 0
    assert document["ledger"]["final"]["totals"]["train_flops"] > 0
    assert "books no client training FLOPs" not in (fednas["note"] or "")
    assert fednas["flops_ratio"] == fednas["client_train_flops"] / reference


def test_a_second_run_reuses_every_finished_method(compared, monkeypatch) -> None:
    _code, config, out, content = compared

    def no_training(*args, **kwargs):
        raise AssertionError("a finished method was run again")

    monkeypatch.setattr(execute, "_run_inprocess", no_training)
    again = cli.compare(read_spec(config), out, inprocess=True, echo=lambda line: None)
    assert {m["method"]: m["status"] for m in again["methods"]} == {
        "heterofl": "reused",
        "fjord": "reused",
        "fednas": "reused",
    }
    assert [m["result"] for m in again["methods"]] == [m["result"] for m in content["methods"]]
    assert again["rows"] == content["rows"]


def failing_runner(grid, settings, out_dir, progress=None):
    raise RuntimeError("boom: this method's runner failed")


def test_a_failed_method_is_reported_and_the_others_still_run(
    compared, tmp_path, monkeypatch
) -> None:
    _code, config, out, _content = compared
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    shutil.rmtree(copy / "fednas")
    from fedorasflwr import server_app

    monkeypatch.setitem(server_app.RUNNERS, "fednas", "tests.test_compare:failing_runner")
    code = cli.main(["--run-config", str(config), "--out", str(copy), "--inprocess"])
    assert code == 1
    content = json.loads((copy / "leaderboard.json").read_text())
    entries = by_method(content)
    assert entries["fednas"]["status"] == "failed"
    assert "boom: this method's runner failed" in entries["fednas"]["reason"]
    assert entries["heterofl"]["status"] == entries["fjord"]["status"] == "reused"
    assert {r["method"] for r in content["rows"]} == {"heterofl", "fjord"}
    markdown = (copy / "leaderboard.md").read_text()
    (line,) = [line for line in markdown.splitlines() if line.startswith("| fednas | failed |")]
    assert "boom: this method's runner failed" in line


@pytest.mark.parametrize(
    ("args", "replace", "message"),
    [
        (["--methods", "heterofl,fedorass"], {}, "unknown method 'fedorass'; allowed: fedoras"),
        (["--budget", "time"], {}, "budget = 'time': allowed: one of rounds, flops"),
        ([], {'budget = "flops"': 'budget = "flop"'}, "budget = 'flop': allowed"),
        ([], {"tolerance = 0.2": "tolerence = 0.2"}, "[compare] key 'tolerence' is unknown"),
        (
            [],
            {"[methods.fjord.fjord]": "[methods.fjord.fjord]\nround = 1"},
            "'fjord.round' is unknown; did you mean 'fjord.rounds'?",
        ),
        (
            [],
            {"[methods.fednas]": "[methods.fednas]\ndata.alpha = 0.1"},
            "'data.alpha' belongs to the shared setting",
        ),
        (
            [],
            {"[methods.fjord.fjord]": "[methods.fjrod]\nx = 1\n[methods.fjord.fjord]"},
            "[methods.fjrod]: unknown method 'fjrod'",
        ),
        ([], {"onnx = false": 'onnx = false\nmethod = "fjord"'}, "run config key 'method'"),
        (
            [],
            {"batch-size = 64\n\n[methods.fjord": "batch-size = 0\n\n[methods.fjord"},
            "method 'heterofl': run config 'heterofl.batch-size' = 0",
        ),
        (["--reference", "fedoras"], {}, "reference = 'fedoras': allowed: one of the compared"),
    ],
)
def test_a_bad_comparison_is_refused_before_anything_runs(
    tmp_path, capsys, args, replace, message
) -> None:
    config = write_tiny(tmp_path / "bad.toml", tmp_path / "cache", **replace)
    out = tmp_path / "out"
    code = cli.main(["--run-config", str(config), "--out", str(out), "--inprocess", *args])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_scaled_rounds_by_hand() -> None:
    config = {"fedoras.rounds": 30, "fedoras.finetune-rounds": 3}
    assert scaled_rounds("fedoras", config, 0.4) == {
        "fedoras.rounds": 12,
        "fedoras.finetune-rounds": 1,  # 1.2 -> 1
    }
    assert scaled_rounds("fedoras", config, 0.01) == {
        "fedoras.rounds": 1,
        "fedoras.finetune-rounds": 1,  # at least one round
    }
    # a stage switched off (DecNAS's gm0-rounds = 0) stays off
    decnas = {"decnas.gm0-rounds": 0, "decnas.final-rounds": 2}
    assert scaled_rounds("decnas", decnas, 2.6) == {
        "decnas.gm0-rounds": 0,
        "decnas.final-rounds": 5,
    }


def test_pareto_marks_the_best_model_at_each_cost() -> None:
    rows = [
        {"model": "a", "macs": 2, "global_test_accuracy": 0.4},
        {"model": "b", "macs": 1, "global_test_accuracy": 0.5},
        {"model": "c", "macs": 2, "global_test_accuracy": 0.7},
        {"model": "d", "macs": 3, "global_test_accuracy": 0.6},
        {"model": "e", "macs": None, "global_test_accuracy": 0.9},
        {"model": "f", "macs": 4, "global_test_accuracy": 0.8},
    ]
    ordered = pareto(rows, "global_test_accuracy")
    assert [(r["model"], r["best_at_cost"]) for r in ordered] == [
        ("b", True),
        ("c", True),
        ("a", False),
        ("d", False),
        ("f", True),
        ("e", False),
    ]


def test_a_model_near_chance_is_flagged_in_the_json_the_table_and_the_log(caplog) -> None:
    rows = [
        {"method": "heterofl", "model": "tier 1", "global_test_accuracy": 0.15},  # 1.5 x 0.1
        {"method": "fjord", "model": "tier 1", "global_test_accuracy": 0.151},
        {"method": "fedoras", "model": "tier 1", "global_test_accuracy": 0.9},
        {"method": "fednas", "model": "net", "global_test_accuracy": None},
    ]
    with caplog.at_level("WARNING"):
        flagged = flag_near_chance(rows, "global_test_accuracy", 0.1)
    assert [r["method"] for r in flagged] == ["heterofl"]
    assert [r["near_chance"] for r in rows] == [True, False, False, None]
    assert "heterofl's model tier 1 is near chance" in caplog.text
    assert "fjord" not in caplog.text
    assert flag_near_chance([dict(rows[0])], "global_test_accuracy", None) == []  # no chance known
    content = {
        "setting_text": "s",
        "engine": "in-process",
        "nodes": 4,
        "budget": {"rule": "rounds", "statement": "as set"},
        "ranked_by": "global_test_accuracy",
        "methods": [],
        "chance": 0.1,
        "near_chance": ["heterofl tier 1"],
        "rows": rows,
    }
    text = markdown(content)
    assert "near chance" in text and "Near chance here: heterofl tier 1." in text
    (flagged_line,) = [line for line in text.splitlines() if "| heterofl |" in line]
    assert flagged_line.rstrip().endswith("**WARNING** |")
    assert all("WARNING" not in line for line in text.splitlines() if "| fjord |" in line)


def test_the_quick_comparison_file_is_valid() -> None:
    spec = read_spec(ROOT / "configs" / "compare-quick.toml", app_dir=ROOT)
    assert set(spec.methods) == set(METHODS)
    assert spec.shared["data.dataset"] == "mnist5k" and spec.nodes == 20


def test_dataset_replaces_the_files_dataset_and_is_checked(tmp_path, monkeypatch) -> None:
    """``--dataset folder:<path>``: every method of the file on the user's own images, each
    method's run config checked against the folder's shape and classes before anything
    runs (a relative path is the user's, from where they ran it); a folder that is no
    dataset is refused naming the key."""
    from fedorasflwr.data.shapes import write_shapes

    folder = write_shapes(tmp_path / "shapes", per_class=40)
    path = ROOT / "configs" / "compare-quick.toml"
    spec = read_spec(path, {"dataset": f"folder:{folder}"}, app_dir=ROOT)
    assert spec.shared["data.dataset"] == f"folder:{folder}"
    assert set(spec.methods) == set(METHODS)
    assert cli._chance(spec.run_config("heterofl")) == pytest.approx(1 / 6)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="data.dataset"):
        read_spec(path, {"dataset": f"folder:{tmp_path / 'empty'}"}, app_dir=ROOT)
    assert read_spec(path, {"dataset": None}, app_dir=ROOT).shared["data.dataset"] == "mnist5k"
    monkeypatch.chdir(tmp_path)
    relative = read_spec(path, {"dataset": "folder:shapes"}, app_dir=ROOT)
    assert relative.shared["data.dataset"] == f"folder:{folder.resolve()}"


@pytest.mark.parametrize("method", METHODS)
def test_the_quick_comparison_runs_each_method_as_its_quick_preset(method) -> None:
    """Each method keeps its quick preset's keys (the file's header): they are copied there,
    so a retuned preset must be copied again. Only the data is shared (the presets' data
    keys are not copied), and FedorAS skips its rand-init comparison (an ablation). (FjORD's
    preset had 12 rounds since 2026-11-27 and CFDNAS's 4 cluster and 6 final rounds since
    2026-12-06, while the file kept 4, 3 and 4 until 2026-12-07.)"""
    import tomllib

    from flwr.common.config import flatten_dict  # dotted keys, as a run config has them

    compare = tomllib.loads((ROOT / "configs" / "compare-quick.toml").read_text())
    preset = tomllib.loads((ROOT / "configs" / f"quick-{method}.toml").read_text())
    ours = flatten_dict(compare["methods"][method])
    theirs = {
        key: value
        for key, value in flatten_dict(preset).items()
        if key != "method" and not key.startswith("data.")
    }
    assert not [key for key in ours if key.startswith("data.")], ours
    if method == "fedoras":
        assert ours.pop("fedoras.compare-rand-init") is False
        assert theirs.pop("fedoras.compare-rand-init") is True
    assert ours == theirs


@pytest.mark.parametrize("method", METHODS)
def test_every_method_has_cost_points_and_round_keys(method) -> None:
    points = points_function(method)({})  # a run that wrote nothing yet: no crash
    assert isinstance(points, list)
    assert all(set(p) == set(POINT_FIELDS) for p in points)
    assert ROUND_KEYS[method] and set(ROUND_KEYS[method]) <= known_keys()


def test_dpfnas_point_carries_the_worst_party_s_epsilon() -> None:
    document = {
        "flops": 200,
        "global_test_accuracy": 0.5,
        "privacy": [{"epsilon": 2.0}, {"epsilon": 3.5}, {"epsilon": 1.0}],
    }
    (point,) = points_function("dpfnas")(document)
    assert point["epsilon"] == 3.5 and point["macs"] == 100
    document["privacy"][1]["epsilon"] = None  # a party without a guarantee
    assert points_function("dpfnas")(document)[0]["epsilon"] == "inf"
