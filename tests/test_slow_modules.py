"""The fast subset (``python -m pytest -m "not slow"``): every module ``tests/slow_modules.txt``
names exists (a typo there would silently keep a slow module in the fast subset), and its
tests carry the ``slow`` marker once collected."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import SLOW_MODULES_FILE, slow_modules

ROOT = Path(__file__).resolve().parents[1]


def test_every_listed_module_exists() -> None:
    listed = slow_modules()
    assert len(listed) >= 10, SLOW_MODULES_FILE.read_text()
    missing = sorted(m for m in listed if not (ROOT / m).is_file())
    assert not missing, f"{SLOW_MODULES_FILE.name} names modules that do not exist: {missing}"


def test_a_listed_modules_tests_are_marked_slow(request: pytest.FixtureRequest) -> None:
    session_items = request.session.items
    listed = slow_modules()
    marked = [i for i in session_items if i.nodeid.split("::")[0] in listed]
    assert all(i.get_closest_marker("slow") for i in marked)
    here = [i for i in session_items if i.nodeid.split("::")[0] == "tests/test_slow_modules.py"]
    assert here and not any(i.get_closest_marker("slow") for i in here)


def test_every_benchmark_smoke_test_exists_and_is_left_out_of_the_default_run(
    request: pytest.FixtureRequest,
) -> None:
    """tests/conftest.py's BENCHMARK_SMOKE_TESTS name real tests, and pyproject's addopts
    leaves them out unless asked for (``python -m pytest -m benchmark``)."""
    import importlib
    import tomllib

    from tests.conftest import BENCHMARK_SMOKE_TESTS

    assert len(BENCHMARK_SMOKE_TESTS) >= 5
    for node_id in BENCHMARK_SMOKE_TESTS:
        path, name = node_id.split("::")
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        assert callable(getattr(module, name, None)), node_id
    addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"][
        "addopts"
    ]
    assert addopts.endswith("-m 'not benchmark'")
    if request.config.getoption("markexpr") == "not benchmark":  # the default run
        ids = {item.nodeid for item in request.session.items}
        assert not ids & BENCHMARK_SMOKE_TESTS
