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
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

__all__ = [
    "RESULTS",
    "ROOT",
    "ProcessCpu",
    "ProcessSampler",
    "headline",
    "machine",
    "machine_busy_jiffies",
    "machine_cpu_seconds",
    "read_process",
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


# --- CPU from /proc (Linux): the machine's, and each process's --------------------------

#: clock ticks per second: the unit of /proc's CPU times
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
#: ``/proc/stat``'s ``cpu`` line: user nice system idle iowait irq softirq steal (guest and
#: guest_nice are already in user and nice); busy is all but idle and iowait
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)


def _cpu_line() -> list[int] | None:
    """The first eight jiffy counters of ``/proc/stat``'s ``cpu`` line (all cores since
    boot); ``None`` where it is missing."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = [int(v) for v in stat.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return fields if len(fields) == 8 else None


def machine_cpu_seconds() -> float:
    """User + nice + system CPU seconds of all cores since boot: what the processes'
    user + system seconds (`read_process`) add up to (Ray's workers run at nice 15).
    0.0 where ``/proc/stat`` is missing."""
    fields = _cpu_line()
    return 0.0 if fields is None else sum(fields[:3]) / TICKS


def machine_busy_jiffies() -> tuple[float, float] | None:
    """(busy, total) jiffies of all cores since boot (busy: all but idle and iowait, so
    interrupts and a VM's stolen time count as unavailable); ``None`` where ``/proc/stat``
    is missing. Busy over total between two readings is how busy the cores were."""
    fields = _cpu_line()
    if fields is None:
        return None
    return float(sum(fields[i] for i in _BUSY_FIELDS)), float(sum(fields))


@dataclass(frozen=True)
class ProcessCpu:
    """One reading of a process: ``cpu_s`` is its user + system seconds so far;
    ``started`` its start time (ticks since boot), so that (pid, started) names one
    process even when the pid is reused."""

    pid: int
    started: int
    command: str
    cpu_s: float


def read_process(pid: int | str) -> ProcessCpu | None:
    """``/proc/<pid>/stat`` and its command line (arguments joined by spaces; empty for a
    zombie or a kernel thread); ``None`` once it has gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()  # after "pid (comm)"
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            command = cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except (OSError, IndexError):  # it ended between the listing and the read
        return None
    # fields[11], [12], [19]: utime, stime, starttime (proc(5)'s 14th, 15th and 22nd)
    return ProcessCpu(
        int(pid), int(fields[19]), command, (int(fields[11]) + int(fields[12])) / TICKS
    )


def read_processes() -> list[ProcessCpu]:
    """Every process's reading (`read_process`), the ones that end meanwhile left out."""
    readings = (read_process(entry) for entry in os.listdir("/proc") if entry.isdigit())
    return [reading for reading in readings if reading is not None]


class ProcessSampler:
    """Every process's CPU seconds, read every ``interval`` seconds while the ``with``
    block runs (a thread), once on entering and once on leaving.

    `spent` is what each process used since: a process already running on entering from
    its reading then, a later one from its start. A process that ends loses at most its
    last ``interval``. ``me`` is this process's pid (its reading thread's CPU included)."""

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.me = os.getpid()
        self.samples = 0
        self._first: dict[tuple[int, int], float] = {}
        self._last: dict[tuple[int, int], ProcessCpu] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="process-sampler", daemon=True)

    def sample(self) -> None:
        """Read every process once."""
        for reading in read_processes():
            key = (reading.pid, reading.started)
            self._first.setdefault(key, reading.cpu_s if self.samples == 0 else 0.0)
            seen = self._last.get(key)
            if seen is not None and not reading.command:  # a zombie: keep the live name
                reading = ProcessCpu(reading.pid, reading.started, seen.command, reading.cpu_s)
            self._last[key] = reading
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> ProcessSampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def spent(self) -> list[tuple[ProcessCpu, float]]:
        """(the last reading, CPU seconds used since it was first seen) per process that
        used any."""
        used = ((reading, reading.cpu_s - self._first[key]) for key, reading in self._last.items())
        return [(reading, seconds) for reading, seconds in used if seconds > 0]
