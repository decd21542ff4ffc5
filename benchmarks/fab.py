"""What every ``flwr run`` of this project pays for its FAB, and what each message pays.

Side by side in one process, on this checkout (with its ``.venv`` inside, as the README
makes it):

- **build, whole directory**: Flower's ``build_fab_from_disk`` on the project directory,
  as ``flwr run <project>`` does before every run: it walks every file (the ``.venv``
  included) and then filters;
- **build, packable copy**: the same function on ``fedorasflwr.launch.fab.packable_app``'s
  copy, which is what the launcher, the engine tests and the benchmarks give ``flwr run``.
  The two FABs must be the same bytes (``same_fab``; the benchmark exits 1 otherwise);
- **unpack per message**: Flower's ``install_from_fab`` on the FAB's bytes into an existing
  install (hash, unzip, verify every file: what a deployment ClientApp process does for
  every message, and every ServerApp and simulation process once), for the FAB the
  project's ``fab-exclude`` gives and for the one it gave without it (the same files and
  Flower's filters, only ``fab-exclude`` removed from ``pyproject.toml``).

CPU seconds (``time.process_time``) and wall seconds per call; each repeat times every
side, rotating which goes first. Prints a Markdown table and ``headline: ...``; writes
``benchmarks/results/fab.json`` (``.quick.json`` for ``--quick``).

    python benchmarks/fab.py            # 5 repeats
    python benchmarks/fab.py --quick    # CI smoke run: 1 repeat
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
import tomllib
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest.mock import patch

from common import ROOT, report

EXCLUDE_KEY = "fab-exclude"


def top_dirs(fab: bytes) -> list[str]:
    """The FAB's top-level names (``.info`` left out)."""
    names = zipfile.ZipFile(io.BytesIO(fab)).namelist()
    return sorted({n.split("/")[0] for n in names} - {".info"})


def fab_without_exclude() -> bytes:
    """The FAB of the same files with ``fab-exclude`` taken out of ``pyproject.toml``."""
    import tomli_w
    from flwr.cli.build import build_fab_from_files

    from fedorasflwr.launch.fab import packable_files

    files: dict[str, bytes | Path] = {p: ROOT / p for p in packable_files(ROOT)}
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    config["tool"]["flwr"]["app"].pop(EXCLUDE_KEY, None)
    files["pyproject.toml"] = tomli_w.dumps(config).encode()
    # Flower refuses to build a FAB over FAB_MAX_SIZE (10 MiB): the repository without the
    # excludes has grown past it (benchmark results, images), so the limit is lifted here
    # to measure it, and ``measure`` records that Flower would have refused it.
    with patch("flwr.cli.build.FAB_MAX_SIZE", sys.maxsize):
        return build_fab_from_files(files)[0]


def timed(call: Callable[[], Any]) -> tuple[float, float, Any]:
    cpu, wall = time.process_time(), time.perf_counter()
    value = call()
    return time.process_time() - cpu, time.perf_counter() - wall, value


def measure(repeats: int) -> dict[str, Any]:
    from flwr.cli.build import build_fab_from_disk, build_fab_from_files
    from flwr.cli.install import install_from_fab
    from flwr.cli.utils import collect_files
    from flwr.common.constant import FAB_MAX_SIZE

    from fedorasflwr.launch.fab import packable_app, packable_files

    def copy_build() -> bytes:
        with packable_app(ROOT) as app:
            return build_fab_from_disk(app)

    def whole_dir_build() -> tuple[int, bytes]:
        """``build_fab_from_disk(ROOT)`` in its two steps, to keep the walk's file count."""
        files = collect_files(ROOT)
        return len(files), build_fab_from_files(files)[0]

    lean, full = copy_build(), fab_without_exclude()
    with tempfile.TemporaryDirectory() as home:
        installs = Path(home)
        for fab in (lean, full):  # installed once, as a node has it before its messages
            install_from_fab(fab, installs, skip_prompt=True)
        sides: dict[str, Callable[[], Any]] = {
            "build_whole_dir": whole_dir_build,
            "build_packable_copy": copy_build,
            "unpack_fab": lambda: install_from_fab(lean, installs, skip_prompt=True),
            "unpack_fab_without_exclude": lambda: install_from_fab(
                full, installs, skip_prompt=True
            ),
        }
        rows, walked = [], 0
        for repeat in range(repeats):
            names = list(sides)
            order = names[repeat % len(names) :] + names[: repeat % len(names)]
            row: dict[str, Any] = {"repeat": repeat, "first": order[0]}
            for name in order:
                cpu, wall, value = timed(sides[name])
                row[f"{name}_cpu"], row[f"{name}_wall"] = cpu, wall
                if name == "build_whole_dir":
                    walked, whole = value
                    row["same_fab"] = whole == lean  # the copy's FAB is Flower's own
            rows.append(row)
    return {
        "rows": rows,
        "files_walked_whole_dir": walked,
        "files_copied": len(packable_files(ROOT)),
        "fab_bytes": len(lean),
        "fab_bytes_without_exclude": len(full),
        "flower_fab_max_bytes": FAB_MAX_SIZE,
        "fab_top_dirs": top_dirs(lean),
        "fab_top_dirs_without_exclude": top_dirs(full),
        "same_fab": all(row["same_fab"] for row in rows),
    }


SIDES = ("build_whole_dir", "build_packable_copy", "unpack_fab", "unpack_fab_without_exclude")


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| repeat | first | " + " | ".join(f"{s} CPU s / wall s" for s in SIDES) + " | same FAB |",
        "|---:|---|" + "---:|" * len(SIDES) + "---|",
    ]
    for row in rows:
        cells = " | ".join(f"{row[f'{s}_cpu']:.3f} / {row[f'{s}_wall']:.3f}" for s in SIDES)
        lines.append(f"| {row['repeat']} | {row['first']} | {cells} | {row['same_fab']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke run: 1 repeat")
    args = parser.parse_args(argv)
    if str(ROOT) not in sys.path:  # this checkout's launcher, not an installed one
        sys.path.insert(0, str(ROOT))
    result = measure(1 if args.quick else 5)
    rows = result["rows"]
    print(table(rows))

    def median(key: str) -> float:
        return statistics.median(r[key] for r in rows)

    summary = {
        "build_whole_dir_cpu_s": median("build_whole_dir_cpu"),
        "build_packable_copy_cpu_s": median("build_packable_copy_cpu"),
        "whole_dir_over_copy_cpu": median("build_whole_dir_cpu")
        / median("build_packable_copy_cpu"),
        "unpack_cpu_s": median("unpack_fab_cpu"),
        "unpack_without_exclude_cpu_s": median("unpack_fab_without_exclude_cpu"),
        "fab_kib": round(result["fab_bytes"] / 1024),
        "fab_kib_without_exclude": round(result["fab_bytes_without_exclude"] / 1024),
        "files_walked_whole_dir": result["files_walked_whole_dir"],
        "same_fab": result["same_fab"],
        "without_exclude_over_flower_limit": result["fab_bytes_without_exclude"]
        > result["flower_fab_max_bytes"],
        "load_average": os.getloadavg()[0],
    }
    report("fab", args.quick, summary, result)
    if not result["same_fab"]:
        print("error: the packable copy's FAB differs from Flower's own build", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
