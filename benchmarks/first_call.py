"""What a forked ClientApp task pays on its first calls, by what its parent preloaded.

The warm executor (``fedorasflwr.launch.warm``) imports some modules once and forks one child
per task; whatever a child imports or initialises on a first call it pays again in every task.
This measures, in a fresh interpreter per preload set, the CPU seconds a forked child spends on
the first calls of one local training step as this project's clients take it (model, SGD with
momentum, forward, cross-entropy, backward, step, ``state_dict``), and the threads the parent
holds before the fork (each preload must start none).

    python benchmarks/first_call.py            # 5 forks per preload set
    python benchmarks/first_call.py --quick    # CI smoke run (2 forks)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from typing import Any

from common import report

#: preload sets compared: the executor's before issue 44, and its default now
PRELOADS = {
    "torch": ("torch", "flwr.supernode.runtime.run_clientapp"),
    "torch+dynamo": ("torch", "torch._dynamo", "flwr.supernode.runtime.run_clientapp"),
}

CHILD = r"""
import importlib, json, os, sys, time
for module in sys.argv[1].split(","):
    importlib.import_module(module)
threads = len(os.listdir("/proc/self/task"))
out = []
for _ in range(int(sys.argv[2])):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        import torch
        from torch import nn
        started = time.process_time()
        net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 26 * 26, 10))
        optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        optimizer_s = time.process_time() - started
        loss = nn.functional.cross_entropy(net(torch.randn(8, 1, 28, 28)), torch.arange(8))
        loss.backward()
        optimizer.step()
        net.state_dict()
        total = time.process_time() - started
        os.write(write, json.dumps({"optimizer-s": optimizer_s, "step-s": total}).encode())
        os._exit(0)
    os.close(write)
    data = b""
    while chunk := os.read(read, 4096):
        data += chunk
    os.waitpid(pid, 0)
    out.append(json.loads(data))
print(json.dumps({"threads-before-fork": threads, "children": out}))
"""


def measure(preload: tuple[str, ...], forks: int) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, ",".join(preload), str(forks)],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    steps = [c["step-s"] for c in result["children"]]
    return {
        "preload": list(preload),
        "threads-before-fork": result["threads-before-fork"],
        "children": result["children"],
        "step-cpu-s-median": statistics.median(steps),
        "optimizer-cpu-s-median": statistics.median(c["optimizer-s"] for c in result["children"]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke run")
    parser.add_argument("--forks", type=int, default=None, help="forks per preload set")
    args = parser.parse_args(argv)
    forks = args.forks or (2 if args.quick else 5)
    rows = {name: measure(preload, forks) for name, preload in PRELOADS.items()}
    print("| parent preloads | threads before fork | first step, CPU-s (median) | of it SGD() |")
    print("| --- | --- | --- | --- |")
    for name, row in rows.items():
        print(
            f"| {name} | {row['threads-before-fork']} | {row['step-cpu-s-median']:.3f} | "
            f"{row['optimizer-cpu-s-median']:.3f} |"
        )
    before, after = rows["torch"], rows["torch+dynamo"]
    summary = {
        "step_cpu_s_before": round(before["step-cpu-s-median"], 4),
        "step_cpu_s_after": round(after["step-cpu-s-median"], 4),
        "saved_cpu_s_per_task": round(before["step-cpu-s-median"] - after["step-cpu-s-median"], 4),
        "extra_threads": after["threads-before-fork"] - before["threads-before-fork"],
    }
    report("first_call", args.quick, summary, {"forks": forks, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
