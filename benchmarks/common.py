"""What every benchmark shares: the app's run config, the headline line, the results file.

Each ``benchmarks/<name>.py`` ends with one line ``headline: key=value ...`` and writes
the same numbers to ``benchmarks/results/<name>.json`` (``<name>.quick.json`` for the
``--quick`` smoke run, which is not kept in git).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

__all__ = ["RESULTS", "ROOT", "headline", "report", "run_config", "warm_data_cache"]


def run_config(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The app's run config as Flower hands it over (``pyproject.toml``), without ONNX
    copies of the final models (no benchmark measures them; 1-3 s per model), plus
    ``overrides``."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from fedorasflwr.progress import setup_logging
    from tests.runconfig import pyproject_run_config

    setup_logging(False)  # each log line once (as the ServerApp does), no DEBUG lines
    return {**pyproject_run_config(), "onnx": False, **overrides}


def warm_data_cache(configs: Sequence[Mapping[str, Any]], num_clients: int) -> None:
    """Partition the data of every run config once, up front, so that no side of a
    comparison pays for it (and parallel workers do not race to fill the cache)."""
    from fedorasflwr.config import parse_run_config
    from fedorasflwr.data import load_client_data, load_server_data

    for config in configs:
        spec = parse_run_config(config).data
        load_server_data(spec)
        for partition in range(num_clients):
            load_client_data(spec, partition, num_clients)


def headline(values: Mapping[str, Any]) -> str:
    """``headline: k=v ...``, floats with three decimals."""
    return "headline: " + " ".join(
        f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items()
    )


def report(name: str, quick: bool, summary: Mapping[str, Any], document: Mapping[str, Any]) -> Path:
    """Print the headline of ``summary`` (plus ``quick``) and write ``document`` with it
    to ``results/<name>[.quick].json``; returns that path."""
    print(headline({**summary, "quick": quick}))
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / (name + (".quick" if quick else "") + ".json")
    path.write_text(
        json.dumps({"quick": quick, **document, "headline": dict(summary)}, indent=2, default=str)
    )
    return path
