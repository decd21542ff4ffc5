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
