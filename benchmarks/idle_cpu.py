"""What an idle local deployment burns: CPU seconds per process while no run is going.

A deployment's processes poll one another (each SuperNode its SuperLink, each ClientApp
executor its SuperNode, the SuperLink's SuperExec the SuperLink), and every poll costs CPU
on both ends. This starts `fedorasflwr.launch.Deployment` (TLS, SuperNode authentication,
warm ClientApp executors, as the tests' and the launcher's), lets it settle, and reads each
of its processes' user + system CPU seconds (``/proc/<pid>/stat``) over a window in which
nothing runs.

    python benchmarks/idle_cpu.py            # 3 SuperNodes, a 60 s window
    python benchmarks/idle_cpu.py --quick    # CI smoke run (2 SuperNodes, 10 s)

For the executors' polling before they backed off when idle (every 0.1 s throughout), run it
with ``fedorasflwr/launch/warm.py`` of commit ``ae8c85e``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, read_process, report

if str(ROOT) not in sys.path:  # this checkout's package, not another installed one
    sys.path.insert(0, str(ROOT))

#: what a process is, by what its command line holds (first match)
ROLES = (
    ("fedorasflwr.launch.warm", "clientapp executor"),
    ("fedorasflwr.launch.supernode", "supernode"),
    ("flower-supernode", "supernode"),
    ("flower-superexec", "superlink superexec"),
    ("flower-superlink", "superlink"),
)


def _cpu_seconds(pid: int) -> float:
    reading = read_process(pid)
    if reading is None:
        raise RuntimeError(f"process {pid} of the idle deployment ended during the window")
    return reading.cpu_s


def _processes(home: Path) -> dict[int, str]:
    """The deployment's processes (their command line or environment names ``home``)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            environ = (entry / "environ").read_bytes().decode(errors="ignore")
        except OSError:
            continue
        if str(home) in command or str(home) in environ:
            role = next((r for key, r in ROLES if key in command), None)
            if role is not None:
                found[int(entry.name)] = role
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke run")
    parser.add_argument("--nodes", type=int, default=None, help="SuperNodes (default 3)")
    parser.add_argument("--seconds", type=float, default=None, help="window (default 60)")
    args = parser.parse_args(argv)
    nodes = args.nodes or (2 if args.quick else 3)
    window = args.seconds or (10.0 if args.quick else 60.0)

    from fedorasflwr.launch import Deployment

    with tempfile.TemporaryDirectory(prefix="idle-cpu-") as tmp:
        home = Path(tmp) / "home"
        with Deployment(num_supernodes=nodes, flwr_home=home):
            time.sleep(5.0)  # past the start-up
            processes = _processes(home)
            before = {pid: _cpu_seconds(pid) for pid in processes}
            started = time.monotonic()
            time.sleep(window)
            after = {pid: _cpu_seconds(pid) for pid in processes}
            elapsed = time.monotonic() - started
    rows = [
        {"pid": pid, "role": role, "cpu_s": round(after[pid] - before[pid], 3)}
        for pid, role in sorted(processes.items(), key=lambda item: item[1])
    ]
    by_role: dict[str, float] = {}
    for row in rows:
        by_role[row["role"]] = by_role.get(row["role"], 0.0) + row["cpu_s"]
    total = sum(by_role.values())
    print(f"| process | CPU-s in {elapsed:.0f} s idle |")
    print("| --- | --- |")
    for role, seconds in sorted(by_role.items()):
        print(f"| {role} (all) | {seconds:.2f} |")
    print(f"| total | {total:.2f} ({total / elapsed:.3f} of a core) |")
    summary = {
        "nodes": nodes,
        "window_s": round(elapsed, 1),
        "idle_cores": round(total / elapsed, 4),
        **{f"{role.replace(' ', '_')}_cpu_s": round(s, 3) for role, s in by_role.items()},
    }
    report("idle_cpu", args.quick, summary, {"rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
