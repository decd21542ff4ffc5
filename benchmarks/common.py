"""What every benchmark shares: the app's run config, the headline line, the results file.

Each ``benchmarks/<name>.py`` ends with one line ``headline: key=value ...`` and writes
the same numbers to ``benchmarks/results/<name>.json`` (``<name>.quick.json`` for the
``--quick`` smoke run, which is not kept in git).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

__all__ = [
    "RESULTS",
    "ROOT",
    "headline",
    "machine",
    "report",
    "run_config",
    "warm_data_cache",
]

_LOAD_AT_IMPORT = os.getloadavg()
"""The load average when the benchmark started (every benchmark imports this module first)."""


def _cpu_name() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    """Where and under what load a benchmark ran, saved with every result: the device
    PyTorch computes on (``fedorasflwr.training.torch_device``; CUDA's card name), torch's
    intra-op threads, the CPUs, the 1/5/15-minute load averages at the start and at the
    end, and when it finished (``finished``: UTC, ISO 8601 to the second; result files
    written before 2026-12-07 lack it). A ratio holds only between figures taken under the
    same conditions."""
    import torch

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from fedorasflwr.training import torch_device

    device = torch_device()
    return {
        "device": str(device),
        "device_name": (
            torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name()
        ),
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "load_average_start": [round(v, 2) for v in _LOAD_AT_IMPORT],
        "load_average_end": [round(v, 2) for v in os.getloadavg()],
        "finished": datetime.now(UTC).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "torch": torch.__version__,
    }


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


def dataset_label(dataset: str) -> str:
    """``dataset`` as a result file names it: a ``folder:`` dataset by its folder's name."""
    return dataset.split("/")[-1] if dataset.startswith("folder:") else dataset


def report(name: str, quick: bool, summary: Mapping[str, Any], document: Mapping[str, Any]) -> Path:
    """Print the headline of ``summary`` (plus ``quick``) and write ``document`` with it
    and the ``machine()`` it ran on to ``results/<name>[.quick].json``; returns that path."""
    print(headline({**summary, "quick": quick}))
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / (name + (".quick" if quick else "") + ".json")
    saved = {"quick": quick, **document, "machine": machine(), "headline": dict(summary)}
    path.write_text(json.dumps(saved, indent=2, default=str))
    return path
