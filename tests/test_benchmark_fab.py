"""Smoke test of ``benchmarks/fab.py --quick``: the packable copy gives Flower's own FAB,
byte for byte, and that FAB holds the apps' code, not the repository."""

from __future__ import annotations

from flwr.supercore.constant import MAX_TOTAL_BYTES

from tests.test_benchmarks import run_quick


def test_fab_quick_builds_flowers_fab_from_the_copy_and_leaves_the_repository_out():
    saved = run_quick("fab")
    # the copy's FAB is Flower's own build of the project, byte for byte, on every repeat
    assert saved["same_fab"] is True and all(row["same_fab"] for row in saved["rows"])
    assert saved["fab_top_dirs"] == ["README.md", "fedorasflwr", "pyproject.toml"]
    assert {"benchmarks", "docs", "tests"} <= set(saved["fab_top_dirs_without_exclude"])
    assert saved["fab_bytes"] < saved["fab_bytes_without_exclude"]
    # the app's FAB stays under the size Flower accepts (the repository as a whole does not)
    assert saved["fab_bytes"] <= saved["flower_fab_max_bytes"] == 10 * 1024 * 1024
    # far from the 10 MB `flwr app publish` allows (`flwr run` itself sets no limit)
    assert saved["fab_bytes"] < MAX_TOTAL_BYTES / 4
    # Flower walks every file, the copy only what its filters could keep
    assert saved["files_copied"] < saved["files_walked_whole_dir"]
    (row,) = saved["rows"]
    assert all(row[key] > 0 for key in row if key.endswith(("_cpu", "_wall")))
