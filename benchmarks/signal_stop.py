"""How fast ``python -m fedorasflwr.launch`` stops on SIGTERM: idle, and under a CPU load.

A tiny FedorAS run (the signal test's: MNIST-5k, 2 SuperNodes, a checkpoint every round)
is started through the launcher; once its first ``checkpoint.pt`` exists, every process it
started is listed, ``--load`` busy-loop processes are started (none for the idle case),
and the launcher gets SIGTERM. Measured from the signal: the launcher's exit, how many of
its processes still run at 5 s, and when the last of them is gone (a zombie counts as
gone). Also checked: exit code 143 and a ``result.json`` beside the checkpoint.

    python benchmarks/signal_stop.py               # idle, then 4 busy loops; 1 trial each
    python benchmarks/signal_stop.py --load 8 --trials 3

Prints a table and ``headline: ...``; writes ``benchmarks/results/signal_stop.json``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, report, run_config

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fedorasflwr.launch import find_pids, format_run_config, stop_pids  # noqa: E402
from fedorasflwr.launch.processes import _is_alive, _parent_pid  # noqa: E402
from tests.runconfig import tiny_fedoras  # noqa: E402

#: the launcher as a child subreaper: processes Flower detaches stay its descendants
SUBREAPER_EXEC = (
    "import ctypes, os, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'fedorasflwr.launch', *sys.argv[1:]])\n"
)
BUSY_LOOP = "while True: pass"


def descendants(pid: int) -> set[tuple[int, str]]:
    """Every running descendant of ``pid``: (PID, start time), PID reuse told apart."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            children.setdefault(_parent_pid(int(entry.name)), []).append(int(entry.name))
    found, todo = set(), list(children.get(pid, []))
    while todo:
        child = todo.pop()
        if _is_alive(child):
            found.add((child, _start_time(child)))
        todo += children.get(child, [])
    return found


def _start_time(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except OSError:
        return ""


def running(snapshot: set[tuple[int, str]]) -> int:
    return sum(1 for pid, start in snapshot if _start_time(pid) == start and _is_alive(pid))


def trial(work: Path, cache: Path, load: int) -> dict:
    """One launch stopped with SIGTERM after its first checkpoint; what was measured."""
    out, home = work / "out", work / "flwr-home"
    config = tiny_fedoras(
        cache,
        **{
            "fedoras.rounds": 4,
            "fedoras.clients-per-round": 2,
            "fedoras.min-replies": 1,
            "checkpoint-every": 1,
            "output-dir": str(out),
        },
    )
    argv = ["--app-dir", str(ROOT), "--num-supernodes", "2", "--flwr-home", str(home)]
    argv += ["--run-config", format_run_config(config)]
    launcher = subprocess.Popen(
        [sys.executable, "-c", SUBREAPER_EXEC, *argv],
        cwd=work,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    busy: list[subprocess.Popen[bytes]] = []
    try:
        deadline = time.monotonic() + 900
        while not list(out.glob("fedoras-*/checkpoint.pt")) and launcher.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError("no checkpoint within 900 s")
            time.sleep(0.2)
        if launcher.poll() is not None:
            raise RuntimeError(f"the launcher exited first: {launcher.stderr.read()[-2000:]}")
        started = descendants(launcher.pid)
        busy = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(load)]
        time.sleep(1.0 if load else 0.0)  # the load is on before the signal
        load_average = os.getloadavg()[0]
        sent = time.monotonic()
        launcher.send_signal(signal.SIGTERM)
        exit_s = gone_s = at_5s = None
        while time.monotonic() - sent < 120:
            now = time.monotonic() - sent
            if exit_s is None and launcher.poll() is not None:
                exit_s = now
            left = running(started)  # cheap (its PIDs' stat files); /proc scan only at 0
            if left == 0:
                left = len(find_pids(flwr_home=home))
            if at_5s is None and now >= 5.0:
                at_5s = left
            if left == 0 and gone_s is None:
                gone_s = now
            if exit_s is not None and gone_s is not None and now >= 5.0:
                break
            time.sleep(0.05)
        code = launcher.wait(timeout=60)
        results = list(out.glob("fedoras-*/result.json"))
        return {
            "load_processes": load,
            "load_average": round(load_average, 1),
            "processes": len(started),
            "exit_s": round(exit_s, 2) if exit_s is not None else None,
            "all_gone_s": round(gone_s, 2) if gone_s is not None else None,
            "running_at_5s": at_5s,
            "exit_code": code,
            "result_json": bool(results),
        }
    finally:
        for process in busy:
            process.kill()
            process.wait()
        if launcher.poll() is None:
            stop_pids([launcher.pid])
        stop_pids([], flwr_home=home)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", type=int, default=4, help="busy loops under load (4)")
    parser.add_argument("--trials", type=int, default=1, help="trials per case (1)")
    args = parser.parse_args()
    run_config({})  # logging as the benchmarks set it
    rows = []
    with tempfile.TemporaryDirectory(prefix="signal-stop-") as tmp:
        cache = Path(tmp) / "cache"
        for load in (0, args.load):
            for index in range(args.trials):
                work = Path(tmp) / f"load{load}-{index}"
                work.mkdir()
                rows.append(trial(work, cache, load))
                print(rows[-1], flush=True)
    print("| busy loops | load avg | processes | launcher exit s | all gone s | left at 5 s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(
            f"| {row['load_processes']} | {row['load_average']} | {row['processes']} | "
            f"{row['exit_s']} | {row['all_gone_s']} | {row['running_at_5s']} |"
        )
    idle = [r for r in rows if r["load_processes"] == 0]
    loaded = [r for r in rows if r["load_processes"] > 0]
    summary = {
        "idle_exit_s_max": max(r["exit_s"] for r in idle),
        "loaded_exit_s_max": max(r["exit_s"] for r in loaded),
        "all_gone_s_max": max(r["all_gone_s"] for r in rows),
        "left_at_5s_max": max(r["running_at_5s"] for r in rows),
        "exit_codes_143": all(r["exit_code"] == 143 for r in rows),
        "result_json_kept": all(r["result_json"] for r in rows),
    }
    report("signal_stop", False, summary, {"trials": rows, "load": args.load})


if __name__ == "__main__":
    main()
