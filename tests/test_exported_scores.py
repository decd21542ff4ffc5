"""Every method's tiny run, once, and what it wrote (issues 41, 42 and the model files).

For every method, a tiny run of the ServerApp's ``main`` on the in-process grid (a global
test set and ONNX copies of every final model) writes ``result.json`` and its model files:

- **what a run exports is what it scored** (issue 41): a fresh Python process loads each
  ``.pt`` with ``fedorasflwr.load_model`` and each ``.onnx`` in onnxruntime, scores it on the
  global test set as a user would (no recalibration), and its accuracy equals the figure
  ``result.json`` reports for that file (exactly for ``.pt``, to 0.5 pp for ``.onnx``), its
  predictions agree sample by sample with the predictions of the module the run scored, and
  those predictions are not one class; ``result.json`` does not contradict itself;
- **every model file comes back** as the module the run had (``load_model``), in eval mode,
  with the same outputs; DecNAS's deployable ``result.arrays``, FDNAS's averaged test
  accuracy, every final model's accuracy on the server's global test set, the DARTS nets'
  FLOPs (``tests/test_model_files.py`` has the files ``load_model`` refuses).

One module, so that each method runs once for all of these (the suite hands a module to one
worker: a second module would run them again)."""

from __future__ import annotations

import copy
import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from flwr.app import ArrayRecord, Context, RecordDict

import fedorasflwr.server_app as server_app
from fedorasflwr import load_model
from fedorasflwr.artifacts import load_checkpoint
from fedorasflwr.client_app import app as client_app
from fedorasflwr.config import parse_run_config
from fedorasflwr.data import load_global_test, load_server_data
from fedorasflwr.export import example_inputs
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.progress import summary_lines
from fedorasflwr.results import snake_keys
from fedorasflwr.runs import RunFiles
from fedorasflwr.search_spaces import SearchSpace, build_prunable
from fedorasflwr.server_app import main
from fedorasflwr.training import evaluate, ordered_loader, refresh_batchnorm, torch_device
from tests.runconfig import ROOT, tiny_decnas, tiny_fdnas, tiny_fednas, tiny_fedoras
from tests.strategies.test_dpfnas_strategy import small_dpfnas
from tests.strategies.test_widths import tiny as tiny_widths

#: what every run here adds to its tiny config: the global test set (45 digits of each class:
#: mnist5k's 500, less the server slice's 50, times data.global-test-fraction 0.1) and ONNX
EXPORTS = {"data.global-test": True, "onnx": True}
GLOBAL_COUNT = 450

#: method -> (its runner module, its tiny run config, nodes); the DARTS methods' derived nets
#: get a few more final rounds than their tiny configs, which leave them at chance (so a
#: comparison of predictions would prove little)
RUNS = {
    "fedoras": (
        "fedoras",
        lambda c: tiny_fedoras(
            c, **{"fedoras.num-tiers": 1, "fedoras.compare-rand-init": True, **EXPORTS}
        ),
        6,
    ),
    "fdnas": ("fdnas", lambda c: tiny_fdnas(c, **EXPORTS), 6),
    "cfdnas": ("fdnas", lambda c: tiny_fdnas(c, method="cfdnas", **EXPORTS), 6),
    "dpfnas": (  # unnoised (mode fnas): the noise comes from the OS, so a noised search's
        # genotype, and so its derived net's accuracy, differs per run (0.10 seen: chance)
        "dpfnas",
        lambda c: small_dpfnas(
            c,
            **{
                "dpfnas.mode": "fnas",
                "dpfnas.final-rounds": 3,
                "dpfnas.final-local-epochs": 2,
                **EXPORTS,
            },
        ),
        2,
    ),
    "decnas": ("decnas", lambda c: tiny_decnas(c, **EXPORTS), 6),
    "fednas": (
        "fednas",
        lambda c: tiny_fednas(
            c, **{"fednas.final-rounds": 3, "fednas.final-local-epochs": 2, **EXPORTS}
        ),
        2,
    ),
    "heterofl": ("widths", lambda c: tiny_widths(c, "heterofl", **EXPORTS), 4),
    "fjord": ("widths", lambda c: tiny_widths(c, "fjord", **EXPORTS), 4),
}
#: the width baselines: their checkpoint.pt holds the full-width ConvNet
WIDTHS = ("heterofl", "fjord")

#: a user's scoring of the files, in a process that has seen nothing of the run: argv is
#: the run config (JSON) and the model files; prints each file's accuracy and predictions
SCORER = """
import json, sys
import numpy as np, onnxruntime, torch
from fedorasflwr import load_model
from fedorasflwr.config import parse_run_config
from fedorasflwr.data import load_global_test

settings = parse_run_config(json.loads(sys.argv[1]))
inputs, labels = load_global_test(settings.data).tensors
scores = {}
for path in sys.argv[2:]:
    if path.endswith(".onnx"):
        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        logits = torch.from_numpy(session.run(None, {"input": inputs.numpy()})[0])
    else:
        with torch.no_grad():
            logits = load_model(path)(inputs)
    predicted = logits.argmax(dim=1)
    accuracy = float((predicted == labels).double().mean())
    scores[path] = {"accuracy": accuracy, "predictions": predicted.tolist()}
print(json.dumps(scores))
"""


def reported(method: str, result: dict[str, Any]) -> dict[str, float]:
    """Each final model's file -> the global-test accuracy ``result.json`` reports for it."""
    if method == "fedoras":
        return {
            f"tier-{m['tier']}" + ("" if m["init"] == "supernet" else f"-{m['init']}-init"): m[
                "global_test_accuracy"
            ]
            for m in result["models"]
        }
    if method in ("fdnas", "cfdnas"):
        return {n["name"]: n["global_test_accuracy"] for n in result["nets"]}
    if method in ("dpfnas", "fednas"):
        return {"derived": result["global_test_accuracy"]}
    if method == "decnas":
        figures = {f"gm-{m['iteration']}": m["global_test_accuracy"] for m in result["frontier"]}
        for m in result["frontier"]:
            if m.get("tuned_global_test_accuracy") is not None:
                figures[f"gm-{m['iteration']}-tuned"] = m["tuned_global_test_accuracy"]
        return figures
    return {f"tier-{t['tier']}": t["global_test_accuracy"] for t in result["tiers"]}


class Run:
    """One method's tiny run through the ServerApp's ``main``: its ``result.json``, what the
    runner returned (``document``) and what its strategy's ``start`` returned (``result``),
    every ``RunFiles.save`` (``saved``, by file name), each final model's score and the
    predictions of the module it scored on the global test set (``scored``, by file stem),
    and a fresh process's scores of the files it wrote (``fresh``)."""

    def __init__(self, method: str, cache: Path, out_dir: Path) -> None:
        module_name, make_config, nodes = RUNS[method]
        self.config = {**make_config(cache), "method": method, "output-dir": str(out_dir)}
        self.settings = parse_run_config(self.config)
        self.saved: dict[str, dict[str, Any]] = {}
        self.scored: dict[str, tuple[float, list[int]]] = {}
        module = importlib.import_module(f"fedorasflwr.methods.{module_name}.runner")
        # the runner's ``start``: its own name, or ``runs.start`` where it uses the module
        owner = module if hasattr(module, "start") else module.runs
        real_start, real_save = owner.start, RunFiles.save
        real_save_final, real_runner = RunFiles.save_final, server_app.runner

        def start(strategy, *args, **kwargs):
            self.strategy = strategy
            self.result = real_start(strategy, *args, **kwargs)
            return self.result

        def save(files, name, arrays, **kwargs):
            self.saved[f"{name}.pt"] = {"arrays": arrays, **kwargs}
            return real_save(files, name, arrays, **kwargs)

        def save_final(files: RunFiles, name: str, model: torch.nn.Module, *args, **kwargs):
            final = real_save_final(files, name, model, *args, **kwargs)
            with torch.no_grad():  # the module the run scored, as it scored it
                predicted = model.cpu().eval()(files.global_test.data.tensors[0]).argmax(dim=1)
            self.scored[name] = (final.score.accuracy, predicted.tolist())
            return final

        def runner(name: str):
            run = real_runner(name)

            def keep(*args, **kwargs):
                self.document = run(*args, **kwargs)
                return self.document

            return keep

        context = Context(
            run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=self.config
        )
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(owner, "start", start)
            patch.setattr(RunFiles, "save", save)
            patch.setattr(RunFiles, "save_final", save_final)
            patch.setattr(server_app, "runner", runner)
            main(InProcessGrid(client_app, self.config, nodes), context)
        (self.out_dir,) = [p.parent for p in out_dir.glob("*/result.json")]
        self.inputs = example_inputs(self.settings.data, 4)[0]
        self.result_json = json.loads((self.out_dir / "result.json").read_text())
        self.reported = reported(method, self.result_json)
        files = [
            str(self.out_dir / f"{name}.{kind}")
            for name in self.reported
            for kind in ("pt", "onnx")
        ]
        done = subprocess.run(
            [sys.executable, "-c", SCORER, json.dumps(self.config), *files],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=600,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        self.fresh = {Path(k).name: v for k, v in json.loads(done.stdout).items()}

    def model_files(self) -> list[str]:
        return sorted(p.name for p in self.out_dir.glob("*.pt"))


@pytest.fixture(scope="module")
def runs(data_cache, tmp_path_factory):
    made: dict[str, Run] = {}

    def run(method: str) -> Run:
        if method not in made:
            made[method] = Run(method, data_cache, tmp_path_factory.mktemp(method))
        return made[method]

    return run


@pytest.mark.parametrize("method", list(RUNS))
def test_every_exported_model_scores_what_result_json_reports(runs, method):
    run = runs(method)
    assert run.result_json["status"]["finished"] is True
    assert run.reported and set(run.scored) == set(run.reported)
    for name, figure in run.reported.items():
        assert (
            f"{name}.pt" in run.result_json["files"] and f"{name}.onnx" in run.result_json["files"]
        )
        assert run.result_json["onnx"][f"{name}.onnx"]["valid"] is True
        fresh, onnx = run.fresh[f"{name}.pt"], run.fresh[f"{name}.onnx"]
        accuracy, scored = run.scored[name]
        assert accuracy == figure, name
        # the fresh process scores on the CPU: to the sample where the run did too
        exact = not torch.cuda.is_available()
        assert fresh["accuracy"] == pytest.approx(figure, abs=1e-12 if exact else 0.005), name
        assert onnx["accuracy"] == pytest.approx(figure, abs=0.005), name
        # sample by sample: the files' predictions are those of the module the run scored
        for scoring in (fresh, onnx):
            agree = sum(a == b for a, b in zip(scoring["predictions"], scored, strict=True))
            full = scoring is fresh and exact
            assert agree == len(scored) if full else agree >= 0.995 * len(scored)
    # not vacuous: the best model is above chance and does not call every sample one class
    best = max(run.reported, key=run.reported.get)
    assert run.reported[best] > 0.15, run.reported
    assert len(set(run.fresh[f"{best}.pt"]["predictions"])) > 1


#: result keys that hold a cost without naming its unit: each must have a sibling that does
UNITLESS = ("low", "high", "budget", "resource")
UNITS = ("flops", "macs", "ms", "params")


def _unitless(value: Any, where: str = "") -> list[str]:
    """Where ``value`` holds a ``UNITLESS`` key without a sibling ``<key>_<unit>`` of the same
    value (the run's settings and ledger aside: their keys are config keys and counters)."""
    found: list[str] = []
    if isinstance(value, dict):
        for key in UNITLESS:
            if key in value and not any(value.get(f"{key}_{unit}") == value[key] for unit in UNITS):
                found.append(f"{where}.{key}")
        for key, item in value.items():
            if key not in ("settings", "ledger"):
                found += _unitless(item, f"{where}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _unitless(item, f"{where}[{index}]")
    return found


@pytest.mark.parametrize("method", list(RUNS))
def test_result_json_does_not_contradict_itself(runs, method):
    run = runs(method)
    status = run.result_json["status"]
    # finished: the state says so, and the last stage ended, with its rounds counted
    assert (status["state"], status["finished"], status["stage_done"]) == ("finished", True, True)
    assert status["step"] > 0 and "error" not in status and "interrupted_by" not in status
    # every cost names its unit
    assert _unitless(run.result_json) == []


# --- every model file comes back ---------------------------------------------------------


def _loaded(module: torch.nn.Module, arrays: ArrayRecord) -> torch.nn.Module:
    original = copy.deepcopy(module)
    original.load_state_dict(arrays.to_torch_state_dict(), strict=True)
    return original.eval()


def _same_outputs(loaded: torch.nn.Module, original: torch.nn.Module, x: torch.Tensor) -> None:
    """Equal logits on ``x``; a supernet on two of its paths (and DARTS's mixed network)."""
    assert not loaded.training
    calls: list[tuple[Any, ...]] = [(x,)]
    if isinstance(original, SearchSpace):
        options = original.num_options()
        calls = [(x, tuple(0 for _ in options)), (x, tuple(n - 1 for n in options))]
        if type(original).__name__ == "DartsSpace":
            calls.append((x,))
    with torch.no_grad():
        for args in calls:
            torch.testing.assert_close(loaded(*args), original(*args), rtol=0, atol=0)


# the files each run writes, and the module each must come back as
KINDS = {
    "fedoras": ["checkpoint.pt", "supernet.pt", "tier-1-random-init.pt", "tier-1.pt"],
    "fdnas": ["checkpoint.pt", "fdnas.pt", "supernet.pt"],
    "cfdnas": [
        "checkpoint.pt",
        "cluster-0.pt",
        "cluster-1.pt",
        "cluster-2.pt",
        "fdnas.pt",
        "supernet.pt",
    ],
    "dpfnas": ["checkpoint.pt", "derived.pt", "supernet.pt"],
    "decnas": ["checkpoint.pt", "gm-0.pt", "gm-1-tuned.pt", "gm-1.pt"],
    "fednas": ["checkpoint.pt", "derived.pt", "supernet.pt"],
    **{m: ["checkpoint.pt", "tier-1.pt", "tier-2.pt", "tier-3.pt", "tier-4.pt"] for m in WIDTHS},
}


@pytest.mark.parametrize("method", list(RUNS))
def test_every_model_file_a_run_writes_loads_with_the_runs_outputs(runs, method):
    run = runs(method)
    assert run.model_files() == KINDS[method]
    for name in run.model_files():
        loaded = load_model(run.out_dir / name)
        content = load_checkpoint(run.out_dir / name)
        if name in run.saved:  # written by RunFiles.save: it names its builder
            entry = run.saved[name]
            assert content["builder"] == entry["builder"]
            module = entry.get("model")
            original = _loaded(run.strategy.space if module is None else module, entry["arrays"])
        elif method == "decnas":  # checkpoint.pt: GM_T as searched, with its spec
            original = _loaded(build_prunable(**content["space"]), run.result.untuned_arrays)
        elif method in WIDTHS:  # checkpoint.pt: the full-width ConvNet as trained (its head
            # the default, scaled: the file names it, a file without it reads as flatten)
            assert content["space"]["head"] == run.strategy.net.head == "flatten-scaled"
            original = _loaded(run.strategy.net, run.result.arrays)
        else:  # checkpoint.pt and FedorAS's supernet.pt: the searched supernet
            supernet = run.result.supernet if method == "cfdnas" else run.result.arrays
            original = _loaded(run.strategy.space, supernet)
        assert type(loaded) is type(original), name
        _same_outputs(loaded, original, run.inputs)


def test_decnas_result_arrays_is_the_tuned_model_and_its_file(runs):
    run = runs("decnas")
    final = run.result.frontier[-1]
    assert final.iteration == 1 and final.tuned_arrays is not None
    tuned, searched = final.tuned_arrays.to_torch_state_dict(), final.arrays.to_torch_state_dict()
    assert any(not torch.equal(tuned[k], searched[k]) for k in tuned)  # tuning moved it
    for record, expected in ((run.result.arrays, tuned), (run.result.untuned_arrays, searched)):
        state = record.to_torch_state_dict()
        assert state.keys() == expected.keys()
        assert all(torch.equal(state[k], expected[k]) for k in state)
    assert run.document["final-model"] == "gm-1-tuned.pt"
    # the files hold these weights with BatchNorm statistics re-estimated on the server's
    # slice, as scored (runs.RunFiles.save_final): every weight equal, statistics refreshed
    for name, weights in (("gm-1-tuned.pt", tuned), ("gm-1.pt", searched)):
        written = load_checkpoint(run.out_dir / name)["state_dict"]
        assert written.keys() == weights.keys()
        statistics = {k for k in weights if k.endswith(("running_mean", "running_var"))}
        trained = [k for k in weights if k not in statistics and "num_batches" not in k]
        assert trained and all(torch.equal(written[k], weights[k]) for k in trained)
        assert any(not torch.equal(written[k], weights[k]) for k in statistics)
    deployed = load_model(run.out_dir / run.document["final-model"])
    original = _loaded(build_prunable(**final.spec), run.saved["gm-1-tuned.pt"]["arrays"])
    _same_outputs(deployed, original, run.inputs)


def test_fdnas_averaged_test_accuracy_weights_partitions_by_test_samples(runs):
    run = runs("cfdnas")
    assert "test-count" in run.document["accuracy-convention"]
    for net, entry in zip(run.result.nets, run.document["nets"], strict=True):
        count = sum(net.test_count.values())
        by_hand = sum(net.test_accuracy[p] * net.test_count[p] for p in net.test_count) / count
        assert net.averaged_test_accuracy == pytest.approx(by_hand, abs=1e-12)
        assert entry["averaged-accuracy"] == net.averaged_test_accuracy
        assert entry["test-count"] == net.test_count and count > 0


#: method -> where its document lists its final models, and the files of the first model
#: and of its global-test accuracy's key
GLOBAL_MODELS = {
    "fedoras": ("models", "tier-1.pt", "global-test-accuracy"),
    "cfdnas": ("nets", "fdnas.pt", "global-test-accuracy"),
    "dpfnas": (None, "derived.pt", "global-test-accuracy"),
    "decnas": ("frontier", "gm-0.pt", "global-test-accuracy"),
    "fednas": (None, "derived.pt", "global-test-accuracy"),
}


@pytest.mark.parametrize("method", list(GLOBAL_MODELS))
def test_every_final_model_is_scored_on_the_server_s_global_test_set(runs, method):
    run = runs(method)
    listed, first_file, key = GLOBAL_MODELS[method]
    entries = [run.document] if listed is None else run.document[listed]
    assert entries
    for entry in entries:
        assert 0.0 <= entry[key] <= 1.0
        assert entry["global-test-count"] == GLOBAL_COUNT
    if method == "fedoras":  # per tier and per init
        assert {e["init"] for e in entries} == {"supernet", "random"}
    if method == "decnas":  # GM_T's tuned model too
        assert 0.0 <= entries[-1]["tuned-global-test-accuracy"] <= 1.0
    # the first model's figure, recomputed here: its file's module, BatchNorm statistics
    # re-estimated on the server's slice, scored in eval mode on the 450 digits
    data = load_global_test(run.settings.data)
    assert len(data) == GLOBAL_COUNT
    net = load_model(run.out_dir / first_file)
    refresh_batchnorm(net, load_server_data(run.settings.data))
    device = torch_device()  # where the runner scored it (refresh_batchnorm moved net there)
    expected = evaluate(net.to(device).eval(), ordered_loader(data), device)
    assert expected.count == GLOBAL_COUNT
    assert entries[0][key] == pytest.approx(expected.accuracy, abs=1e-9)
    # and the console's summary shows it
    text = "\n".join(summary_lines(method, snake_keys(run.document), run.settings.method_settings))
    assert "global test acc" in text


@pytest.mark.parametrize("method", ["dpfnas", "fednas"])
def test_a_darts_derived_net_s_cost_is_its_modules_forward_flops(runs, method):
    """DP-FNAS and FedNAS write the derived net's ``flops`` / ``macs`` (its path in the
    supernet: ``search_spaces.darts.genotype_cost``): torch's FLOP counter on the saved
    ``derived.pt``, one sample, gives the same figure."""
    from torch.utils.flop_counter import FlopCounterMode

    run = runs(method)
    net = load_model(run.out_dir / "derived.pt").eval()
    sample, _source = example_inputs(run.settings.data)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        net(sample[:1])
    assert run.document["flops"] == counter.get_total_flops() > 0
    assert run.document["macs"] == run.document["flops"] // 2
