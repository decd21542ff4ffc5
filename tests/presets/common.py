"""Run a quick preset whole, as its file sets it, on the in-process grid (20 nodes, what
``python -m fedorasflwr.launch`` starts), and read what a person sees: ``result.json``
and the printed summary. Issue 28: every quick preset must show its method's point."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr.app import Context, RecordDict
from flwr.common.config import parse_config_args

from fedorasflwr.client_app import app as client_app
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.progress import summary_lines
from fedorasflwr.server_app import main
from tests.runconfig import ROOT, pyproject_run_config

NODES = 20  # the launcher's --num-supernodes default
MIN_ACCURACY = 0.5  # 5x chance on MNIST-5k's 10 classes
#: the quick DP-FNAS and FedNAS presets' derived net (one darts cell, the same final
#: training): 13 pp below the lowest of every cell benchmarks/dpfnas_draws.py measured
#: there with the space's flatten head (0.878-0.920, the weightless cell included)
EVERY_CELL_ACCURACY = 0.75


@dataclass
class PresetRun:
    document: dict[str, Any]
    summary: list[str]
    run_dir: Path


def run_preset(name: str, out: Path, cache: Path) -> PresetRun:
    """``configs/<name>.toml`` over the pyproject defaults; only where files go differs
    (and ONNX export, which has its own tests)."""
    config = pyproject_run_config() | parse_config_args([str(ROOT / "configs" / f"{name}.toml")])
    config |= {"output-dir": str(out), "data.cache-dir": str(cache), "onnx": False}
    context = Context(run_id=7, node_id=0, node_config={}, state=RecordDict(), run_config=config)
    main(InProcessGrid(client_app, config, NODES), context)
    (run_dir,) = out.iterdir()
    document = json.loads((run_dir / "result.json").read_text())
    assert document["status"]["finished"] is True, document["status"]
    return PresetRun(document, summary_lines(document["method"], document), run_dir)


def entropy_ratio(entropies: Iterable[float], options: int) -> float:
    """Mean entropy of softmax(alpha) over the layers, as a fraction of uniform's."""
    values = list(entropies)
    return sum(values) / len(values) / math.log(options)


def plots(run_dir: Path) -> set[str]:
    return {path.name for path in run_dir.glob("*.png")}
