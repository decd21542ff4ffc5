"""What a run exports is what it scored (issue 41): for every method, a tiny run of the
ServerApp's ``main`` on the in-process grid writes ``result.json`` and its final models; a
fresh Python process then loads each ``.pt`` with ``fedorasflwr.load_model`` and each
``.onnx`` in onnxruntime, scores it on the global test set as a user would (no
recalibration), and its accuracy equals the figure ``result.json`` reports for that file
(exactly for ``.pt``, to 0.5 pp for ``.onnx``), its predictions agree sample by sample with
the predictions of the module the run scored, and those predictions are not one class."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from flwr.app import Context, RecordDict

from fedorasflwr.client_app import app as client_app
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.runs import RunFiles
from fedorasflwr.server_app import main
from tests.runconfig import ROOT, tiny_decnas, tiny_fdnas, tiny_fednas, tiny_fedoras
from tests.strategies.test_dpfnas_strategy import small_dpfnas
from tests.strategies.test_widths import tiny as tiny_widths

#: what every run here adds to its tiny config: the global test set and ONNX copies
EXPORTS = {"data.global-test": True, "onnx": True}

#: method -> (its tiny run config, nodes); the DARTS methods' derived nets get a few more
#: final rounds than their tiny configs, which leave them at chance (so a comparison of
#: predictions would prove little)
RUNS = {
    "fedoras": (lambda c: tiny_fedoras(c, **{"fedoras.num-tiers": 1, **EXPORTS}), 6),
    "fdnas": (lambda c: tiny_fdnas(c, **EXPORTS), 6),
    "cfdnas": (lambda c: tiny_fdnas(c, method="cfdnas", **EXPORTS), 6),
    "dpfnas": (
        lambda c: small_dpfnas(
            c, **{"dpfnas.final-rounds": 3, "dpfnas.final-local-epochs": 2, **EXPORTS}
        ),
        2,
    ),
    "decnas": (lambda c: tiny_decnas(c, **EXPORTS), 6),
    "fednas": (
        lambda c: tiny_fednas(
            c, **{"fednas.final-rounds": 3, "fednas.final-local-epochs": 2, **EXPORTS}
        ),
        2,
    ),
    "heterofl": (lambda c: tiny_widths(c, "heterofl", **EXPORTS), 4),
    "fjord": (lambda c: tiny_widths(c, "fjord", **EXPORTS), 4),
}

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
    """One method's tiny run through the ServerApp's ``main``: its ``result.json``, each final
    model's score and the predictions of the module it scored, on the global test set (by
    file name), and a fresh process's scores of the files it wrote."""

    def __init__(self, method: str, cache: Path, out_dir: Path) -> None:
        make_config, nodes = RUNS[method]
        self.config = {**make_config(cache), "method": method, "output-dir": str(out_dir)}
        self.scored: dict[str, tuple[float, list[int]]] = {}
        real_save_final = RunFiles.save_final

        def save_final(files: RunFiles, name: str, model: torch.nn.Module, *args, **kwargs):
            final = real_save_final(files, name, model, *args, **kwargs)
            with torch.no_grad():  # the module the run scored, as it scored it
                predicted = model.cpu().eval()(files.global_test.data.tensors[0]).argmax(dim=1)
            self.scored[name] = (final.score.accuracy, predicted.tolist())
            return final

        context = Context(
            run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=self.config
        )
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(RunFiles, "save_final", save_final)
            main(InProcessGrid(client_app, self.config, nodes), context)
        (self.out_dir,) = [p.parent for p in out_dir.glob("*/result.json")]
        self.result = json.loads((self.out_dir / "result.json").read_text())
        self.reported = reported(method, self.result)
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
    assert run.result["status"]["finished"] is True
    assert run.reported and set(run.scored) == set(run.reported)
    for name, figure in run.reported.items():
        assert f"{name}.pt" in run.result["files"] and f"{name}.onnx" in run.result["files"]
        assert run.result["onnx"][f"{name}.onnx"]["valid"] is True
        fresh, onnx = run.fresh[f"{name}.pt"], run.fresh[f"{name}.onnx"]
        accuracy, scored = run.scored[name]
        assert accuracy == figure, name
        # the fresh process scores on the CPU: to the sample where the run did too
        exact = not torch.cuda.is_available()
        assert fresh["accuracy"] == pytest.approx(figure, abs=1e-12 if exact else 0.005), name
        assert onnx["accuracy"] == pytest.approx(figure, abs=0.005), name
        # sample by sample: the files' predictions are those of the module the run scored
        for copy in (fresh, onnx):
            agree = sum(a == b for a, b in zip(copy["predictions"], scored, strict=True))
            assert agree == len(scored) if copy is fresh and exact else agree >= 0.995 * len(scored)
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
    status = run.result["status"]
    # finished: the state says so, and the last stage ended, with its rounds counted
    assert (status["state"], status["finished"], status["stage_done"]) == ("finished", True, True)
    assert status["step"] > 0 and "error" not in status and "interrupted_by" not in status
    # every cost names its unit
    assert _unitless(run.result) == []
