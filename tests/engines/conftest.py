"""Fixtures that run the project's Flower app on real engines (see `fedorasflwr.launch`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from fedorasflwr.launch import ConfigValue, Deployment, RunResult, run_simulation

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TIMEOUT = 900.0


@pytest.fixture
def project_root() -> Path:
    """The repository root: the Flower app's directory (``flwr run <project_root>``)."""
    return PROJECT_ROOT


@pytest.fixture
def flwr_home(tmp_path: Path) -> Path:
    """A fresh ``FLWR_HOME`` (kept with pytest's temp dirs for post-mortems)."""
    home = tmp_path / "flwr-home"
    home.mkdir()
    return home


@pytest.fixture
def simulation_runner(flwr_home: Path) -> Callable[..., RunResult]:
    """Run the project's app on the simulation engine: ``runner(num_supernodes=4, ...)``.

    Keyword arguments go to `fedorasflwr.launch.run_simulation` (``run_config``,
    ``client_num_cpus``, ``env``, ``timeout`` ...); a failed run raises
    `fedorasflwr.launch.FlowerRunError`.
    """

    def run(
        *,
        num_supernodes: int = 4,
        run_config: Mapping[str, ConfigValue] | str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        **kwargs: object,
    ) -> RunResult:
        return run_simulation(
            PROJECT_ROOT,
            num_supernodes=num_supernodes,
            run_config=run_config,
            flwr_home=flwr_home,
            timeout=timeout,
            **kwargs,  # type: ignore[arg-type]
        )

    return run


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Callable[..., Deployment]]:
    """Start a local deployment: ``dep = deployment(num_supernodes=2, ...)``; stopped at teardown.

    Keyword arguments go to `fedorasflwr.launch.Deployment` (``node_configs``, ``env``
    ...). Run the app with ``dep.run(project_root, run_config, timeout)``.
    """
    started: list[Deployment] = []

    def start(*, num_supernodes: int = 2, **kwargs: object) -> Deployment:
        home = tmp_path / f"deployment-{len(started)}"
        engine = Deployment(num_supernodes=num_supernodes, flwr_home=home, **kwargs)  # type: ignore[arg-type]
        started.append(engine.__enter__())
        return engine

    yield start
    for engine in reversed(started):
        engine.stop()
