"""FedorAS Stage 1 on the three ways to run it, side by side, and where a deployment
message's time goes.

One run, same seed, same data cache, 3 clients (2 in the ``--quick`` smoke run):

- **inprocess**: strategy and ClientApp in this process through
  ``fedorasflwr.inprocess.InProcessGrid`` (clients one after the other);
- **simulation**: ``flwr run`` on the simulation engine (Ray, one CPU per ClientApp);
- **deployment**: a real SuperLink and 3 SuperNodes on localhost
  (``fedorasflwr.launch.Deployment``: TLS and SuperNode authentication on), each
  message's ClientApp forked from its node's warm executor (``fedorasflwr.launch.warm``),
  no more at once than the host's cores allow (``clientapp_slots``: 2 on 2 cores, as Ray);
- (full run only) **deployment-cold**: the same with Flower's own per-message
  ``flwr-clientapp`` processes (``warm_clientapps=False``; no slots: Flower's SuperExecs
  start every message's process at once), headline ``*_deployment_cold_over_warm``;
- (full run only) **deployment-all-at-once**: the warm deployment without the host's
  ClientApp slots (``Deployment(clientapp_slots=0)``: every node's message at once, the
  behaviour before stop 48), headline ``*_deployment_all_at_once_over_slots``;
- (full run only) **deployment-flower-supernode**: the deployment with Flower's own
  ``flower-supernode`` timing (3 s after a pull that found nothing, 0.5 s between reply
  checks) instead of ``fedorasflwr.launch.supernode``'s (``Deployment(prompt_supernodes=False)``),
  headline ``*_deployment_flower_supernode_over_prompt``;
- (full run only) **deployment-flower-polling**: the deployment with Flower's own reply
  polling (the ServerApp's ``HttpGrid`` pulls every 3 s) instead of ``PromptGrid``
  (``fedorasflwr/federation/polling.py``), headline ``*_flower_polling_over_prompt``.
  (The simulation engine's ServerApp pulls from an in-memory grid every 0.1 s: nothing
  to gain there.)

Two configs: **tiny** (width 0.25, every node every round, 1 local epoch: overhead
dominates) and **default** (the pyproject defaults with ``fedoras.stop-after=supernet``
and fewer rounds: local training dominates).  Round seconds come from the ServerApp's
history (configure to aggregate); round 1 pays one-off start-up, so medians use the
later rounds.

The ClientApp logs timestamps per message when ``$FEDORASFLWR_TIMING_LOG`` is set
(``fedorasflwr/client_app.py``): process start (from ``/proc``), app module imported,
handler entry, data loaded, reply built, the seconds to serialize the reply, how many
arrays the message carried and the parent process.  The rest of a deployment round
(round seconds minus the slowest client's process start to reply) is the SuperNode's
and ServerApp's polling and transport.  Flower's ``run_clientapp`` pulls the message
(every array its own object) before it installs the FAB and imports the app, so process
start to handler of a Stage-1 message includes that pull: the **per-message fixed
cost** (headline ``*_per_message_fixed_s``) is process start to handler entry of the
messages without arrays (the profile query), the cost every message pays whatever it
carries.  It is compared with a bare ``python -c "import torch"`` timed here.

    python benchmarks/engines.py            # tiny and default, 4 rounds each (medians of 3)
    python benchmarks/engines.py --quick    # tiny, 2 nodes, 2 rounds, one bare import (CI smoke)
    python benchmarks/engines.py --extra deployment-flower-supernode   # only that variant

Writes ``benchmarks/results/engines.json`` (``.quick.json``); a run of some configs or
variants writes ``engines.<configs>[.<variant>...].json`` instead, e.g.
``engines.default.deployment-flower-supernode.json``.

The machine's load is recorded while each engine runs (issue 44 item 3: the goals hold
only on an idle machine): a thread of this process samples every 0.5 s the 1-minute load
average (``os.getloadavg``) and the CPU busy fraction since the previous sample (all
cores, from ``/proc/stat``: user, nice, system, irq, softirq and steal over those and
idle and iowait), each stamped with ``time.time()``; one last sample when the run
returns.  The ServerApp's history gives each round's seconds (``time.perf_counter``
deltas) but no wall-clock stamp, so a round's **window** is the span of its training
messages in the ClientApp timing log (epoch stamps and the message's ``server-round``):
the earliest message's start (its process start on a deployment, where every message has
its own process; its handler entry elsewhere) to the latest reply built.  The window
leaves out the ServerApp's configure and aggregate and the transport before the first
and after the last message (``window_s`` beside ``round_seconds`` shows how much).  Per
engine, ``round_load`` has one entry per round: the mean load average and mean busy
fraction of the samples stamped inside its window and their count (none: ``None``);
``run_load`` the same over the whole run, and ``max_sample_gap_s`` the longest time
between two samples (a window longer than that holds at least one).  The engines' own
processes count in both figures: an idle machine shows the benchmark's own load, not 0.

Headline, per config: ``deployment_over_simulation`` and ``simulation_over_inprocess``
(what the simulation engine adds to a Stage-1 round against the same strategy and
ClientApp in one process, clients one after the other: the measure of the former
``stage1_overhead.py``, folded in here), the median rounds, the per-message fixed cost
``per_message_fixed_s`` (the full run: also Flower's cold processes' and
``deployment_cold_over_warm``), and a Stage-1 message's process start to handler
against the bare import.  Beside the median ratio, ``deployment_over_simulation_mean``
(the ratio of the mean rounds after the first: each engine also reports
``mean_round_after_first``), and ``max_round_load``: the highest per-round load average
of any engine of the config (every round, the first too), to see at once whether the
machine was idle.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

from common import ROOT, machine_busy_jiffies, report, run_config, warm_data_cache

NUM_CLIENTS = 3
QUICK_CLIENTS = 2  # the smoke run: 2 nodes, 6 deployment messages instead of 9

ENGINES = ("inprocess", "simulation", "deployment")
TIMING_LOG_ENV = "FEDORASFLWR_TIMING_LOG"  # fedorasflwr.client_app.TIMING_LOG_ENV
GRID_TIMING_LOG_ENV = "FEDORASFLWR_GRID_TIMING_LOG"  # fedorasflwr.federation.polling's
TASK_TIMING_LOG_ENV = "FEDORASFLWR_TASK_TIMING_LOG"  # fedorasflwr.launch.warm's


def num_clients(quick: bool) -> int:
    """Nodes on every engine: the smoke run's 2 or the full run's 3."""
    return QUICK_CLIENTS if quick else NUM_CLIENTS


def nodes_of(overrides: Mapping[str, Any]) -> int:
    """How many nodes a runner starts: the run's ``min-nodes`` (see `settings`)."""
    return int(overrides["min-nodes"])


def settings(config: str, quick: bool, output_dir: Path, cache_dir: Path) -> dict[str, Any]:
    """Run-config overrides of one config."""
    common = {
        "output-dir": str(output_dir),
        "data.cache-dir": str(cache_dir),
        "min-nodes": num_clients(quick),  # also how many nodes every engine runs
        "fedoras.stop-after": "supernet",
    }
    if config == "tiny":
        return common | {
            "space.width": 0.25,
            "fedoras.rounds": 2 if quick else 4,
            "fedoras.clients-per-round": num_clients(quick),
            "fedoras.local-epochs": 1,
            "fedoras.tier-samples": 2000,
            "fedoras.eval-every": 0,
        }
    return common | {"fedoras.rounds": 4}  # the pyproject's 20, shrunk for time: 3 after the first


def read_history(output_dir: Path) -> list[float]:
    """Round seconds of Stage 1 from the run's ``result.json`` (round 0 is the start)."""
    document = json.loads(next(output_dir.glob("*/result.json")).read_text())
    return [float(h["seconds"]) for h in document["history"][1:]]


def read_timings(path: Path) -> list[dict[str, Any]]:
    """The lines of a timing log: the ClientApp's (one per message) or, from
    `grid_log_of` the same path, the deployment ServerApp's ``PromptGrid`` (one per
    ``send_and_receive``); none if nothing logged."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def grid_log_of(timing_log: Path) -> Path:
    """Where the ServerApp's grid logs its steps beside the ClientApps' ``timing_log``."""
    return timing_log.with_name(timing_log.stem + ".grid.jsonl")


def task_log_of(timing_log: Path) -> Path:
    """Where the warm executor's tasks log their steps beside the ClientApps' ``timing_log``."""
    return timing_log.with_name(timing_log.stem + ".task.jsonl")


#: seconds between two load samples
LOAD_PERIOD = 0.5


class LoadSampler:
    """A thread that samples the machine's load every ``period`` seconds while the
    ``with`` block runs, and once more when it ends: ``samples`` holds dicts of
    ``time`` (``time.time()``), ``load_avg_1m`` (``os.getloadavg()[0]``) and ``cpu_busy``
    (busy over total jiffies of all cores since the previous sample or the start;
    ``None`` without ``/proc/stat`` or when no jiffy passed)."""

    def __init__(self, period: float = LOAD_PERIOD) -> None:
        self.period = period
        self.samples: list[dict[str, float | None]] = []
        self.started = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load-sampler", daemon=True)
        self._last: tuple[float, float] | None = None

    def __enter__(self) -> LoadSampler:
        self.started = time.time()
        self._last = machine_busy_jiffies()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _run(self) -> None:
        deadline = time.monotonic() + self.period
        while not self._stop.wait(max(0.0, deadline - time.monotonic())):
            self._sample()
            deadline += self.period

    def _sample(self) -> None:
        now = machine_busy_jiffies()
        busy = None
        if now is not None and self._last is not None and now[1] > self._last[1]:
            busy = (now[0] - self._last[0]) / (now[1] - self._last[1])
        self._last = now
        self.samples.append(
            {"time": time.time(), "load_avg_1m": os.getloadavg()[0], "cpu_busy": busy}
        )

    def max_gap(self) -> float:
        """Longest seconds between the start and the first sample or between two
        samples: a window inside the run and longer than this holds a sample."""
        stamps = [self.started] + [float(s["time"]) for s in self.samples]
        return max((b - a for a, b in pairwise(stamps)), default=0.0)


def round_windows(
    records: Sequence[Mapping[str, Any]], engine: str, rounds: int
) -> list[tuple[float, float] | None]:
    """Each Stage-1 round's wall-clock window (epoch seconds): its training messages'
    earliest start to latest reply built in the ClientApp timing log (the history has
    only round seconds, no wall-clock stamps).  A message starts at its process start
    on a deployment (a process per message) and at its handler entry elsewhere (the
    process outlives the message).  ``None`` for a round without timing records."""
    spans: dict[int, tuple[float, float]] = {}
    for r in records:
        if not r["message-type"].endswith("fedoras_supernet"):
            continue
        start = r["process-start"] if engine in DEPLOYMENTS else r["handler-entry"]
        first, last = spans.get(r["server-round"], (start, r["reply-built"]))
        spans[r["server-round"]] = (min(first, start), max(last, r["reply-built"]))
    return [spans.get(i) for i in range(1, rounds + 1)]


def load_in(
    samples: Sequence[Mapping[str, Any]], window: tuple[float, float] | None
) -> dict[str, Any]:
    """The samples stamped inside ``window`` (ends included): the window's seconds,
    their count, mean 1-min load average and mean CPU busy fraction (``None`` without
    samples or window)."""
    if window is None:
        return {"window_s": None, "samples": 0, "load_avg_1m": None, "cpu_busy": None}
    start, end = window
    inside = [s for s in samples if start <= s["time"] <= end]
    return {
        "window_s": round(end - start, 3),
        "samples": len(inside),
        "load_avg_1m": _mean([s["load_avg_1m"] for s in inside]),
        "cpu_busy": _mean([s["cpu_busy"] for s in inside]),
    }


def round_load(
    samples: Sequence[Mapping[str, Any]], windows: Sequence[tuple[float, float] | None]
) -> list[dict[str, Any]]:
    """Per round (1, 2, ...): ``load_in`` its window."""
    return [{"round": i, **load_in(samples, w)} for i, w in enumerate(windows, start=1)]


def max_round_load(measured: Mapping[str, Any]) -> float | None:
    """The highest per-round load average of any engine in ``measured`` (one config)."""
    loads = [
        entry["load_avg_1m"]
        for engine in RUNNERS
        if engine in measured
        for entry in measured[engine]["round_load"]
        if entry["load_avg_1m"] is not None
    ]
    return max(loads, default=None)


def run_inprocess(overrides: dict[str, Any], timing_log: Path) -> float:
    """The ServerApp's FedorAS runner on an ``InProcessGrid``; writes ``result.json``."""
    from fedorasflwr.client_app import app
    from fedorasflwr.config import parse_run_config
    from fedorasflwr.inprocess import InProcessGrid
    from fedorasflwr.methods.fedoras.runner import run_fedoras
    from fedorasflwr.results import result_json

    config = run_config(overrides)
    run = parse_run_config(config)
    out_dir = Path(overrides["output-dir"]) / "inprocess"
    out_dir.mkdir(parents=True)
    os.environ[TIMING_LOG_ENV] = str(timing_log)
    started = time.perf_counter()
    try:
        # one torch thread per client, as a Ray actor and a deployment ClientApp here get
        threads = {pid: {"num-threads": 1} for pid in range(nodes_of(overrides))}
        grid = InProcessGrid(app, config, nodes_of(overrides), node_configs=threads)
        document = run_fedoras(grid, run, out_dir)
    finally:
        del os.environ[TIMING_LOG_ENV]
    wall = time.perf_counter() - started
    (out_dir / "result.json").write_text(json.dumps(result_json(document), default=str))
    return wall


def run_simulation_engine(
    overrides: dict[str, Any], timing_log: Path, env: Mapping[str, str] | None = None
) -> float:
    from fedorasflwr.launch import run_simulation

    result = run_simulation(
        ROOT,
        num_supernodes=nodes_of(overrides),
        run_config=overrides,
        client_num_cpus=1,
        timeout=3600,
        env={TIMING_LOG_ENV: str(timing_log), **(env or {})},
    )
    return result.wall_time


def run_deployment(
    overrides: dict[str, Any],
    timing_log: Path,
    env: Mapping[str, str] | None = None,
    warm: bool = True,
    slots: int | None = None,
    prompt: bool = True,
) -> float:
    from fedorasflwr.launch import Deployment

    env = {
        TIMING_LOG_ENV: str(timing_log),
        GRID_TIMING_LOG_ENV: str(grid_log_of(timing_log)),
        TASK_TIMING_LOG_ENV: str(task_log_of(timing_log)),
        **(env or {}),
    }
    nodes = nodes_of(overrides)
    with Deployment(
        num_supernodes=nodes,
        env=env,
        startup_timeout=180,
        warm_clientapps=warm,
        clientapp_slots=slots,
        prompt_supernodes=prompt,
    ) as deployment:
        result = deployment.run(ROOT, run_config=overrides, timeout=3600)
    return result.wall_time


def run_deployment_cold(overrides: dict[str, Any], timing_log: Path) -> float:
    """The deployment with Flower's own ``flwr-clientapp`` process per message."""
    return run_deployment(overrides, timing_log, warm=False)


def run_deployment_all_at_once(overrides: dict[str, Any], timing_log: Path) -> float:
    """The warm deployment without the host's ClientApp slots (``clientapp_slots=0``):
    every node's message runs at once, whatever the cores."""
    return run_deployment(overrides, timing_log, slots=0)


def run_deployment_flower_polling(overrides: dict[str, Any], timing_log: Path) -> float:
    """The deployment with Flower's own reply polling (its ServerApp grid, ``HttpGrid``,
    pulls every 3 s) instead of ``fedorasflwr.federation.polling.PromptGrid``."""
    return run_deployment(overrides, timing_log, {"FEDORASFLWR_GRID_POLLING": "flower"})


def run_deployment_flower_supernode(overrides: dict[str, Any], timing_log: Path) -> float:
    """The deployment with Flower's own SuperNode timing (``flower-supernode``: 3 s after
    an empty pull, 0.5 s between reply checks) instead of
    ``fedorasflwr.launch.supernode``'s prompt one."""
    return run_deployment(overrides, timing_log, prompt=False)


def run_deployment_fresh_imports(overrides: dict[str, Any], timing_log: Path) -> float:
    """The warm deployment with every task installing the FAB and importing the app itself
    (``FEDORASFLWR_WARM_APPS=fresh``) instead of keeping them between tasks
    (``fedorasflwr.launch.warm_apps``)."""
    return run_deployment(overrides, timing_log, {"FEDORASFLWR_WARM_APPS": "fresh"})


RUNNERS = {
    "inprocess": run_inprocess,
    "simulation": run_simulation_engine,
    "deployment": run_deployment,
    "deployment-flower-polling": run_deployment_flower_polling,
    "deployment-flower-supernode": run_deployment_flower_supernode,
    "deployment-cold": run_deployment_cold,
    "deployment-all-at-once": run_deployment_all_at_once,
    "deployment-fresh-imports": run_deployment_fresh_imports,
}
#: the full run also measures the deployment with Flower's 3-s reply polling, with
#: Flower's own SuperNode timing, with Flower's per-message ClientApp processes, with
#: every ClientApp at once (no slots) and with every task importing its app itself
FULL_ONLY = (
    "deployment-flower-polling",
    "deployment-flower-supernode",
    "deployment-cold",
    "deployment-all-at-once",
    "deployment-fresh-imports",
)
DEPLOYMENTS = ("deployment",) + FULL_ONLY


def warm_cost_cache(config: Mapping[str, Any]) -> None:
    """Build the supernet once, so its cost tables are in the disk cache for every
    engine's ClientApps (as they are on a node after its first message)."""
    from fedorasflwr.config import parse_run_config
    from fedorasflwr.runs import build_supernet

    build_supernet(parse_run_config(config))


def bare_torch_import_seconds(repeats: int = 3, at_once: int = 1) -> float:
    """Median wall seconds of ``python -c "import torch"``, ``at_once`` fresh processes
    started together (a deployment round starts one ClientApp per node at once)."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        running = [subprocess.Popen([sys.executable, "-c", "import torch"]) for _ in range(at_once)]
        for process in running:
            if process.wait() != 0:
                raise RuntimeError("python -c 'import torch' failed")
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _median(values: Sequence[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def _mean(values: Sequence[float | None]) -> float | None:
    """Mean of the known values (``None`` skipped: a sample without a busy figure), or
    ``None`` without any."""
    known = [v for v in values if v is not None]
    return round(statistics.fmean(known), 4) if known else None


def breakdown(records: Sequence[Mapping[str, Any]], engine: str) -> dict[str, float | None]:
    """Median seconds per phase of the training messages (``fedoras_supernet``).

    ``start_to_app_imported``: process start, Python and Flower's imports (none when
    forked warm), pulling the message, installing the FAB, the app's imports
    (deployment only: elsewhere the process outlives the message);
    ``app_imported_to_handler``: building the ClientApp and its mods;
    ``data_load``, ``training`` (local epochs and the reply's arrays), ``serialize``;
    ``per_message_fixed`` (deployment): process start to handler entry of the messages
    without arrays (any type), nothing to pull.
    """
    train = [r for r in records if r["message-type"].endswith("fedoras_supernet")]
    phases: dict[str, list[float]] = {
        "data_load": [r["data-loaded"] - r["handler-entry"] for r in train],
        "training": [r["reply-built"] - r["data-loaded"] for r in train],
        "serialize": [r["serialize-seconds"] for r in train],
    }
    if engine in DEPLOYMENTS:
        bare = [r for r in records if r.get("arrays", 0) == 0]
        phases["per_message_fixed"] = [r["handler-entry"] - r["process-start"] for r in bare]
        phases["start_to_app_imported"] = [r["module-loaded"] - r["process-start"] for r in train]
        phases["app_imported_to_handler"] = [r["handler-entry"] - r["module-loaded"] for r in train]
        phases["fixed_start_to_handler"] = [r["handler-entry"] - r["process-start"] for r in train]
    return {name: _median(values) for name, values in phases.items()}


#: a warm task's steps in order (`task_phases`): each from the previous mark to its own
TASK_PHASES = (
    ("fork", "forked", "child"),
    ("client", "child", "pull_task_input-start"),
    ("pull", "pull_task_input-start", "pull_task_input-end"),
    ("install_fab", "install_from_fab-start", "install_from_fab-end"),
    ("to_load", "install_from_fab-end", "load_client_app-start"),
    ("import_app", "load_client_app-start", "load_client_app-end"),
    ("to_handler", "load_client_app-end", "handler-entry"),
    ("handler", "handler-entry", "reply-built"),
    ("to_push", "reply-built", "push_message-start"),
    ("push", "push_message-start", "push_message-end"),
    ("exit", "push_message-end", "end"),
)


def task_phases(
    records: Sequence[Mapping[str, Any]], tasks: Sequence[Mapping[str, Any]]
) -> dict[str, dict[str, float | None]]:
    """Median seconds per step of the warm executor's tasks (``fedorasflwr.launch.warm``'s
    task timing joined by pid to the ClientApp's record), for the messages without arrays
    (``bare``: what every message pays) and the training messages (``train``); each step
    from the previous mark to its own (`TASK_PHASES`), ``fork_to_handler`` the sum up to
    the handler. Empty without task records (Flower's cold processes, other engines)."""
    by_pid = {r["pid"]: r for r in records}
    groups: dict[str, list[dict[str, Any]]] = {"bare": [], "train": []}
    for task in tasks:
        app = by_pid.get(task["pid"])
        if app is None:
            continue
        marks = {**task, **app}
        kind = "train" if app["message-type"].endswith("fedoras_supernet") else None
        if app.get("arrays", 0) == 0:
            kind = "bare"
        if kind is not None:
            groups[kind].append(marks)
    result: dict[str, dict[str, float | None]] = {}
    for kind, group in groups.items():
        if not group:
            continue
        phases = {
            name: _median([m[end] - m[start] for m in group if start in m and end in m])
            for name, start, end in TASK_PHASES
        }
        phases["fork_to_handler"] = _median([m["handler-entry"] - m["forked"] for m in group])
        phases["messages"] = len(group)
        result[kind] = phases
    return result


def transport_seconds(records: Sequence[Mapping[str, Any]], rounds: Sequence[float]) -> list[float]:
    """Per deployment round after the first: round seconds minus the slowest client's
    process start to reply built (what polling, dispatch and transport add)."""
    by_round: dict[int, float] = {}
    for r in records:
        if r["message-type"].endswith("fedoras_supernet"):
            span = r["reply-built"] - r["process-start"]
            by_round[r["server-round"]] = max(by_round.get(r["server-round"], 0.0), span)
    return [
        round(rounds[i - 1] - by_round[i], 4) for i in range(2, len(rounds) + 1) if i in by_round
    ]


#: the parts of the time from one round's last reply built to the next round's first
#: process start, in order (`round_gaps`)
GAP_PARTS = ("reply_to_grid", "server", "push", "to_process_start")


def round_gaps(
    records: Sequence[Mapping[str, Any]], steps: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """Where a deployment's time goes between rounds: per round after the first, the
    seconds from the previous round's last reply built (ClientApp) to the next round's
    first process start, in four parts: ``reply_to_grid`` (until the ServerApp's grid
    pulled that reply: SuperNode reply check, push, SuperLink, the grid's poll),
    ``server`` (grid returned to the next step sent: aggregation, evaluation, configure),
    ``push`` (the next messages to the SuperLink) and ``to_process_start`` (until the
    first message's process started: SuperNode pull, executor poll, fork). Each part's
    mean over the rounds, ``total`` and ``rounds`` (how many were split); empty without
    grid records (the simulation engine has none)."""
    training = sorted(
        (s for s in steps if str(s["message-type"]).endswith("fedoras_supernet")),
        key=lambda s: s["sent"],
    )
    built: dict[int, float] = {}
    started: dict[int, float] = {}
    for r in records:
        if r["message-type"].endswith("fedoras_supernet"):
            i = r["server-round"]
            built[i] = max(built.get(i, r["reply-built"]), r["reply-built"])
            started[i] = min(started.get(i, r["process-start"]), r["process-start"])
    parts: dict[str, list[float]] = {part: [] for part in (*GAP_PARTS, "total")}
    for i in range(2, len(training) + 1):
        before, step = training[i - 2], training[i - 1]
        if i - 1 not in built or i not in started or not before["arrivals"]:
            continue
        parts["reply_to_grid"].append(max(before["arrivals"]) - built[i - 1])
        parts["server"].append(step["sent"] - before["returned"])
        parts["push"].append(step["pushed"] - step["sent"])
        parts["to_process_start"].append(started[i] - step["pushed"])
        parts["total"].append(started[i] - built[i - 1])
    if not parts["total"]:
        return {}
    return {
        **{part: round(statistics.fmean(v), 3) for part, v in parts.items()},
        "rounds": len(parts["total"]),
    }


def measure_config(
    name: str, quick: bool, tmp: Path, extra: Sequence[str] | None = None
) -> dict[str, Any]:
    """Run one config on every engine; rounds, walls and the ClientApp timings. ``extra``:
    which of `FULL_ONLY` (default: all of them; none in the quick run)."""
    cache = tmp / "cache"
    warm_data_cache([run_config(settings(name, quick, tmp, cache))], num_clients(quick))
    warm_cost_cache(run_config(settings(name, quick, tmp, cache)))
    measured: dict[str, Any] = {}
    if extra is None:
        extra = () if quick else FULL_ONLY
    for engine in ENGINES + tuple(extra):
        output = tmp / f"{name}-{engine}"
        timing_log = tmp / f"{name}-{engine}.timing.jsonl"
        print(f"[{name}] {engine} ...", flush=True)
        with LoadSampler() as sampler:
            wall = RUNNERS[engine](settings(name, quick, output, cache), timing_log)
        rounds = read_history(output)
        records = read_timings(timing_log)
        later = rounds[1:] or rounds
        run_window = (sampler.started, float(sampler.samples[-1]["time"]))
        measured[engine] = {
            "round_seconds": rounds,
            "round_load": round_load(sampler.samples, round_windows(records, engine, len(rounds))),
            "run_load": load_in(sampler.samples, run_window),
            "max_sample_gap_s": round(sampler.max_gap(), 3),
            "median_round_after_first": _median(later),
            "mean_round_after_first": _mean(later),
            "wall_seconds": round(wall, 2),
            "breakdown": breakdown(records, engine),
            "threads": sorted({r["threads"] for r in records}),
            "messages": len(records),
        }
        if engine in DEPLOYMENTS:
            measured[engine]["transport_seconds"] = transport_seconds(records, rounds)
            steps = read_timings(grid_log_of(timing_log))
            measured[engine]["round_gaps"] = round_gaps(records, steps)
            tasks = read_timings(task_log_of(timing_log))
            measured[engine]["task_phases"] = task_phases(records, tasks)
            measured[engine]["timings"] = records
            measured[engine]["grid_timings"] = steps
            measured[engine]["task_timings"] = tasks
    sim = measured["simulation"]["median_round_after_first"]
    measured["deployment_over_simulation"] = round(
        measured["deployment"]["median_round_after_first"] / sim, 3
    )
    measured["deployment_over_simulation_mean"] = round(
        measured["deployment"]["mean_round_after_first"]
        / measured["simulation"]["mean_round_after_first"],
        3,
    )
    measured["simulation_over_inprocess"] = round(
        sim / measured["inprocess"]["median_round_after_first"], 3
    )
    measured["max_round_load"] = max_round_load(measured)
    return measured


def _load_shown(entry: Mapping[str, Any]) -> str:
    """``load/busy`` of one round (``-`` without samples)."""
    if not entry["samples"]:
        return "-"
    busy = "-" if entry["cpu_busy"] is None else f"{entry['cpu_busy']:.2f}"
    return f"{entry['load_avg_1m']:.2f}/{busy}"


def print_table(results: Mapping[str, Any]) -> None:
    """Per engine: rounds, their median and mean after the first, each round's load
    (1-min load average / CPU busy fraction, means over the round's window) and the
    breakdown; then per config the deployment/simulation ratios and the highest round
    load."""
    print(
        "| config | engine | round s (all) | median after 1st | mean after 1st | "
        "round load (1-min avg/busy) | wall s | "
        "data s | training s | serialize s | start to handler s | fixed s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for config, measured in results.items():
        for engine in [e for e in RUNNERS if e in measured]:
            m = measured[engine]
            b = m["breakdown"]
            shown = ", ".join(f"{r:.2f}" for r in m["round_seconds"])
            loads = ", ".join(_load_shown(entry) for entry in m["round_load"])
            print(
                f"| {config} | {engine} | {shown} | {m['median_round_after_first']:.2f} | "
                f"{m['mean_round_after_first']:.2f} | {loads} | "
                f"{m['wall_seconds']:.1f} | {b['data_load']} | {b['training']} | "
                f"{b['serialize']} | {b.get('fixed_start_to_handler', '-')} | "
                f"{b.get('per_message_fixed', '-')} |"
            )
    print()
    print("| config | deployment/simulation (median) | (mean) | max round load |")
    print("| --- | --- | --- | --- |")
    for config, measured in results.items():
        top = measured["max_round_load"]
        print(
            f"| {config} | {measured['deployment_over_simulation']} | "
            f"{measured['deployment_over_simulation_mean']} | "
            f"{'-' if top is None else f'{top:.2f}'} |"
        )
    print()
    print("Between rounds on a deployment (s, mean over rounds after the first; round_gaps):")
    print(f"| config | engine | {' | '.join(GAP_PARTS)} | total |")
    print("|" + " --- |" * (len(GAP_PARTS) + 3))
    for config, measured in results.items():
        for engine in [e for e in DEPLOYMENTS if e in measured]:
            gaps = measured[engine].get("round_gaps") or {}
            shown = " | ".join(str(gaps.get(part, "-")) for part in (*GAP_PARTS, "total"))
            print(f"| {config} | {engine} | {shown} |")
    print()
    names = [name for name, _, _ in TASK_PHASES]
    print("A warm task's steps (s, medians; task_phases; bare: messages without arrays):")
    print(f"| config | engine | messages | {' | '.join(names)} | fork to handler |")
    print("|" + " --- |" * (len(names) + 4))
    for config, measured in results.items():
        for engine in [e for e in DEPLOYMENTS if e in measured]:
            for kind, phases in (measured[engine].get("task_phases") or {}).items():
                shown = " | ".join(str(phases.get(name, "-")) for name in names)
                print(
                    f"| {config} | {engine} ({kind}) | {phases['messages']} | {shown} | "
                    f"{phases['fork_to_handler']} |"
                )
    print()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny config, 2 nodes, 2 rounds")
    parser.add_argument(
        "--configs", default="tiny,default", help="comma-separated: tiny, default (full run)"
    )
    parser.add_argument(
        "--extra",
        nargs="*",
        choices=FULL_ONLY,
        default=None,
        help="which deployment variants besides the three engines (default: all; quick: none)",
    )
    args = parser.parse_args(argv)
    configs = ["tiny"] if args.quick else args.configs.split(",")
    unknown = set(configs) - {"tiny", "default"}
    if unknown:
        parser.error(f"--configs: unknown {sorted(unknown)}; allowed: tiny, default")
    # the smoke run times the bare import once and skips the 3-at-once comparison
    # (12 torch imports, about 20 CPU-s, for numbers it does not check)
    bare = bare_torch_import_seconds(repeats=1 if args.quick else 3)
    bare_at_once = None if args.quick else bare_torch_import_seconds(at_once=NUM_CLIENTS)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="engines-") as tmp:
        for name in configs:
            results[name] = measure_config(name, args.quick, Path(tmp) / name, args.extra)
    print_table(results)
    summary: dict[str, Any] = {}
    for name, measured in results.items():
        fixed = measured["deployment"]["breakdown"]["fixed_start_to_handler"]
        summary[f"{name}_deployment_over_simulation"] = measured["deployment_over_simulation"]
        summary[f"{name}_deployment_over_simulation_mean"] = measured[
            "deployment_over_simulation_mean"
        ]
        summary[f"{name}_max_round_load"] = measured["max_round_load"]
        summary[f"{name}_simulation_over_inprocess"] = measured["simulation_over_inprocess"]
        summary[f"{name}_deployment_round_s"] = measured["deployment"]["median_round_after_first"]
        summary[f"{name}_simulation_round_s"] = measured["simulation"]["median_round_after_first"]
        summary[f"{name}_inprocess_round_s"] = measured["inprocess"]["median_round_after_first"]
        summary[f"{name}_fixed_over_torch_import"] = round(fixed / bare, 3)
        per_message = measured["deployment"]["breakdown"]["per_message_fixed"]
        summary[f"{name}_per_message_fixed_s"] = per_message
        if "deployment-cold" in measured:
            cold = measured["deployment-cold"]
            summary[f"{name}_cold_per_message_fixed_s"] = cold["breakdown"]["per_message_fixed"]
            summary[f"{name}_deployment_cold_over_warm"] = round(
                cold["median_round_after_first"]
                / measured["deployment"]["median_round_after_first"],
                3,
            )
        if bare_at_once is not None:
            summary[f"{name}_fixed_over_torch_import_3_at_once"] = round(fixed / bare_at_once, 3)
        if "deployment-all-at-once" in measured:
            at_once = measured["deployment-all-at-once"]["median_round_after_first"]
            summary[f"{name}_deployment_all_at_once_over_slots"] = round(
                at_once / measured["deployment"]["median_round_after_first"], 3
            )
        if "deployment-flower-supernode" in measured:
            flower = measured["deployment-flower-supernode"]["median_round_after_first"]
            summary[f"{name}_deployment_flower_supernode_over_prompt"] = round(
                flower / measured["deployment"]["median_round_after_first"], 3
            )
        if "deployment-flower-polling" in measured:
            flower = measured["deployment-flower-polling"]["median_round_after_first"]
            summary[f"{name}_deployment_flower_polling_over_prompt"] = round(
                flower / measured["deployment"]["median_round_after_first"], 3
            )
    summary["bare_torch_import_s"] = round(bare, 3)
    if bare_at_once is not None:
        summary["bare_torch_import_3_at_once_s"] = round(bare_at_once, 3)
    # a run of some configs or variants does not overwrite the whole run's record
    name = "engines"
    if not args.quick and (configs != ["tiny", "default"] or args.extra is not None):
        name += "." + "-".join(configs) + "".join(f".{extra}" for extra in args.extra or ())
    report(
        name,
        args.quick,
        summary,
        {
            "settings": {c: settings(c, args.quick, Path("-"), Path("-")) for c in configs},
            "clients": num_clients(args.quick),
            "bare_torch_import_seconds": bare,
            "bare_torch_import_3_at_once_seconds": bare_at_once,
            "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
            "results": results,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
