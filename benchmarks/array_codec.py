"""What ``fedorasflwr.arrays`` saves against Flower's own ``Array`` conversions
(``np.save`` / ``np.load`` per array), side by side in one process.

Every message's arrays are converted several times on their way (the server's state to an
``ArrayRecord``, packing, unpacking, the client's ``state_dict``, its reply, the server's
aggregation). ``fedorasflwr.arrays.FAST = False`` sends every conversion through Flower's
own ``Array(value)`` / ``Array.numpy()``; ``True`` is the package's default. Measured, each
side in turn (off, on, off, on, ...), in this process's CPU seconds:

- ``state_dict``: one round trip of the default supernet's ``state_dict``
  (``record_of`` then ``state_dict_of``; pyproject's ``cnn_s`` at width 0.5);
- runs on the in-process grid (the real ClientApp, 6 nodes): the tiny FedorAS and FedNAS
  runs of the tests (``tests/runconfig.py``, 64 rows per client), and two rounds of the
  default run config's Stage 1 (MNIST-5k, 10 clients a round). Each pair's results must be
  the same to the bit (the same ``result.json`` figures): the conversion changes no value.

    python benchmarks/array_codec.py            # numbers: benchmarks/README.md
    python benchmarks/array_codec.py --quick    # smoke run (< 1 minute)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import ROOT, report, run_config

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

NODES = 6


def _cpu(action: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    started = time.process_time()
    value = action(*args)
    return time.process_time() - started, value


def _run(config: dict[str, Any], out: Path) -> dict[str, Any]:
    """One run of ``config`` on the in-process grid; its ``result.json`` figures."""
    from flwr.app import Context, RecordDict

    from fedorasflwr.client_app import app as client_app
    from fedorasflwr.inprocess import InProcessGrid
    from fedorasflwr.server_app import main

    config = {**config, "output-dir": str(out)}
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=config)
    main(InProcessGrid(client_app, config, NODES), context)
    (result,) = out.glob("*/result.json")
    document = json.loads(result.read_text())
    return document


def _round_trips(arrays: Any, state: dict[str, Any], trips: int) -> None:
    for _ in range(trips):
        arrays.state_dict_of(arrays.record_of(state))


#: result keys that hold wall-clock figures or a run's own directory: not compared (every
#: other key is, by its exact name: a word inside a name, e.g. "path", skips nothing)
_CLOCK_KEYS = frozenset({"seconds", "elapsed", "started", "finished", "output_dir", "run_dir"})


def _difference(a: Any, b: Any, where: str = "") -> str | None:
    """The first place two results differ in a figure (wall-clock times and each run's
    own paths aside), or ``None``."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(a.keys() | b.keys()):
            if key in _CLOCK_KEYS or key.endswith(("_s", "_seconds")):
                continue
            found = _difference(a.get(key), b.get(key), f"{where}.{key}")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            found = _difference(x, y, f"{where}[{index}]")
            if found:
                return found
        return None
    return None if a == b else f"{where}: {str(a)[:40]} != {str(b)[:40]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (< 1 minute)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side (default 3)")
    args = parser.parse_args()
    quick = args.quick
    repeats = 1 if quick else args.repeats

    import torch

    from fedorasflwr import arrays
    from fedorasflwr.config import parse_run_config
    from fedorasflwr.runs import build_supernet
    from tests.runconfig import FEW_ROWS, tiny_fednas, tiny_fedoras

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        default = run_config(
            {
                "data.cache-dir": str(cache),
                "fedoras.stop-after": "supernet",
                "fedoras.rounds": 2,
                "fedoras.lr-probe": False,
                "min-nodes": NODES,
            }
        )
        state = build_supernet(parse_run_config(default)).state_dict()
        runs = {"fedoras-tiny": {**tiny_fedoras(cache), **FEW_ROWS}}
        if not quick:
            runs["fednas-tiny"] = {**tiny_fednas(cache), **FEW_ROWS}
            runs["fedoras-default-stage1"] = default

        trips = 5 if quick else 50
        sides: dict[str, dict[str, list[float]]] = {"state_dict": {"flower": [], "fast": []}}
        for name in runs:
            sides[name] = {"flower": [], "fast": []}
        same: dict[str, bool] = {}
        for run_name, config in runs.items():  # warm: data partitions, imports, headers
            _run(config, Path(tmp) / f"warm-{run_name}")
        for repeat in range(repeats):
            results: dict[str, dict[str, Any]] = {}
            for side in ("flower", "fast"):
                arrays.FAST = side == "fast"
                seconds, _ = _cpu(_round_trips, arrays, state, trips)
                sides["state_dict"][side].append(seconds / trips)
                for run_name, config in runs.items():
                    out = Path(tmp) / f"{run_name}-{side}-{repeat}"
                    seconds, results[f"{run_name}-{side}"] = _cpu(_run, config, out)
                    sides[run_name][side].append(seconds)
            for run_name in runs:
                found = _difference(results[f"{run_name}-flower"], results[f"{run_name}-fast"])
                if found:
                    print(f"{run_name}: the two sides' results differ at {found}")
                same[run_name] = same.get(run_name, True) and found is None
        arrays.FAST = True

    rows = {}
    for name, side in sides.items():
        flower, fast = statistics.median(side["flower"]), statistics.median(side["fast"])
        rows[name] = {
            "flower_cpu_s": side["flower"],
            "fast_cpu_s": side["fast"],
            "fast_over_flower": round(fast / flower, 3),
        }
        print(f"{name:24s} Flower {flower:8.4f} CPU-s, fast {fast:8.4f}: {fast / flower:.3f}")
    for name, ok in same.items():
        print(f"{name}: results the same both ways: {ok}")
    summary = {f"{k}_ratio": v["fast_over_flower"] for k, v in rows.items()}
    summary["same_results"] = all(same.values())
    report("array_codec", quick, summary, {"repeats": repeats, "rows": rows, "same": same})


if __name__ == "__main__":
    main()
