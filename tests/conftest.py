"""Session-wide test settings: one torch thread, no telemetry, one shared data cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# Tiny models gain nothing from intra-op threads, and a loaded 2-core machine
# makes two threads per process very slow; engines' clients inherit this too.
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One data cache for the session: partitions are built once, then loaded."""
    return tmp_path_factory.mktemp("data-cache")


# --- running the suite on several workers (pytest-xdist, see pyproject's addopts) -------
#
# Tests that share an expensive module- or session-scoped run must land on one worker, or
# each worker would run it again: they get an ``xdist_group`` (the module's name, or the
# README run's), and ``--dist loadgroup`` keeps a group together. The most expensive
# groups are handed out first (``--no-loadscope-reorder`` keeps this order), so the
# longest run does not start last.

#: session-scoped runs shared across modules: the group their users join
_SHARED_RUNS = {"readme_run": "readme-run", "secure_deployment_run": "secure-deployment"}


def _group(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("xdist_group")
    if marker is not None:
        return str(marker.kwargs.get("name", marker.args[0] if marker.args else ""))
    for fixture, group in _SHARED_RUNS.items():
        if fixture in item.fixturenames:
            return group
    fixtures = getattr(item, "_fixtureinfo", None)
    defs = fixtures.name2fixturedefs if fixtures is not None else {}
    if any(d and d[-1].scope == "module" for d in defs.values()):
        return item.module.__name__ if item.module is not None else None
    return None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Whole modules move (their module-scoped fixtures stay set up once): a module that
    # uses a shared run first, then modules with engine runs, then the rest.
    module_cost: dict[str, int] = {}
    for item in items:
        if any(fixture in item.fixturenames for fixture in _SHARED_RUNS):
            cost = 0
        else:
            cost = 1 if item.get_closest_marker("slow") else 2
        module = item.nodeid.split("::")[0]
        module_cost[module] = min(module_cost.get(module, cost), cost)
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (module_cost[item.nodeid.split("::")[0]], order[id(item)]))
    for item in items:
        group = _group(item)
        if group and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker per core, at most 4 (each engine run starts several
    processes and a Ray cluster of its own: more would only compete for memory)."""
    return max(1, min(os.cpu_count() or 1, 4))
