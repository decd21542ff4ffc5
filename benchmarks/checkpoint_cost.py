"""The cost of checkpointing every round (``checkpoint-every = 1``, the default) on the
default run config.

FedorAS Stage 1 of the app's run config (``pyproject.toml``: MNIST-5k, ``cnn_s`` at width
0.5, 10 clients per round, 5 local epochs) on the in-process grid (the real ClientApp)
with ``NODES`` nodes; every checkpoint write (``checkpoint.pt`` written atomically, then
the partial ``result.json``) is timed inside the runner's ``Checkpointer``.  Reported:
the seconds of a round, of a checkpoint write, their ratio, and the checkpoint's size
(the supernet, the history and the ledger: it does not grow with the rounds but for the
history's one entry per round).

    python benchmarks/checkpoint_cost.py            # numbers: benchmarks/README.md, docs/running.md
    python benchmarks/checkpoint_cost.py --quick    # smoke run (< 1 minute)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import ROOT, report, run_config, warm_data_cache

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

NODES = 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (< 1 minute)")
    args = parser.parse_args()
    quick = args.quick

    from fedorasflwr.checkpoints import Checkpointer, Snapshot
    from fedorasflwr.client_app import app as client_app
    from fedorasflwr.config import parse_run_config
    from fedorasflwr.inprocess import InProcessGrid
    from fedorasflwr.server_app import run_header, runner

    writes: list[float] = []

    class Timed(Checkpointer):
        def __call__(self, snapshot: Snapshot) -> None:
            started = time.perf_counter()
            super().__call__(snapshot)
            if self.due(snapshot):
                writes.append(time.perf_counter() - started)

    with tempfile.TemporaryDirectory() as tmp:
        overrides: dict[str, Any] = {
            "data.cache-dir": str(Path(tmp) / "cache"),
            "fedoras.stop-after": "supernet",
            "fedoras.rounds": 1 if quick else 3,
            "fedoras.eval-every": 0,  # the round alone: no server-side validation
        }
        if quick:
            overrides.update({"fedoras.local-epochs": 1, "fedoras.clients-per-round": 2})
        config = run_config(overrides)
        settings = parse_run_config(config)
        assert settings.checkpoint_every == 1, "the default writes a checkpoint every round"
        warm_data_cache([config], NODES)
        out = Path(tmp) / "run"
        out.mkdir()
        # as the ServerApp builds it, result.json's header included
        progress = Timed.for_run(out, settings, header=run_header(settings, 0))
        document = runner("fedoras")(
            InProcessGrid(client_app, config, NODES), settings, out, progress
        )
        size = (out / "checkpoint.pt").stat().st_size
    rounds = [h["seconds"] for h in document["history"] if h.get("round", 0) > 0]
    round_s, write_s = statistics.mean(rounds), statistics.mean(writes)
    print(
        f"{len(rounds)} rounds of {round_s:.2f} s (mean); {len(writes)} checkpoint writes of "
        f"{1000 * write_s:.1f} ms (mean; max {1000 * max(writes):.1f} ms), "
        f"{size / 1e6:.2f} MB each: {100 * write_s / round_s:.2f}% of a round"
    )
    summary = {
        "rounds": len(rounds),
        "round_s": round(round_s, 3),
        "writes": len(writes),
        "write_ms": round(1000 * write_s, 1),
        "write_ms_max": round(1000 * max(writes), 1),
        "checkpoint_mb": round(size / 1e6, 2),
        "share_of_round": round(write_s / round_s, 4),
    }
    report("checkpoint_cost", quick, summary, {"round-seconds": rounds, "write-seconds": writes})


if __name__ == "__main__":
    main()
