"""Run the app on the simulation engine (a local ``flower-superlink --simulation``)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from .fab import packable_app
from .flwr_cli import (
    SIMULATION_CONNECTION,
    ConfigValue,
    RunResult,
    _add_connection,
    _check_positive_int,
    _flower_env,
    _flwr_run,
    _run_command,
)
from .heartbeat import HEARTBEAT_TIMEOUT_ENV, check_heartbeat_timeout, superlink_wrapper
from .processes import _free_ports, _stop_flower_processes, held_signals

__all__ = ["RAY_TIP_FILTER", "run_simulation"]

#: ``PYTHONWARNINGS`` entry silencing the one FutureWarning ``ray.init`` prints in the
#: simulation process (a tip about ``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO``, raised from
#: ``ray._private.worker``); other warnings, and Ray's GPU behaviour, are unchanged.
RAY_TIP_FILTER = "ignore::FutureWarning:ray._private.worker"


def run_simulation(
    app_dir: Path,
    *,
    num_supernodes: int,
    run_config: Mapping[str, ConfigValue] | str | None = None,
    flwr_home: Path | None = None,
    client_num_cpus: int | None = None,
    federation_config: Mapping[str, ConfigValue] | None = None,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    echo: bool | Callable[[str], None] = False,
    heartbeat_timeout: float | None = None,
) -> RunResult:
    """Run the Flower app in `app_dir` on the simulation engine, then stop all of Flower.

    Runs ``flwr run <app_dir> local --stream --federation-config "num-supernodes=N ..."``
    against a local SuperLink on free loopback ports, checks the run's final status
    and always stops that SuperLink and its children (also on error, timeout and
    KeyboardInterrupt, and SIGTERM / SIGHUP under `stop_on_signals`).

    Parameters
    ----------
    app_dir : Path
        Directory holding the app's ``pyproject.toml``.
    num_supernodes : int
        Number of simulated SuperNodes.
    run_config : Mapping or str, optional
        Run-config overrides (a mapping, or a ready ``"k=v ..."`` string).
    flwr_home : Path, optional
        ``FLWR_HOME`` to use and keep; default: a temporary directory, removed afterwards.
        Every Flower process using it is stopped at the end: pass a dedicated one.
    client_num_cpus : int, optional
        CPUs Ray reserves per ClientApp (Flower's default: 2; Flower 1.41 takes whole
        CPUs only). ClientApps running at once = Ray's CPUs // this; raise Ray's
        logical CPU count with ``federation_config={"init-args-num-cpus": n}``.
    federation_config : Mapping, optional
        Further ``--federation-config`` keys, e.g. ``init-args-num-cpus`` (CPUs Ray may
        use), ``client-resources-num-gpus``, ``backend``, ``verbose``.
    timeout : float, optional
        Seconds before the run is abandoned.
    env : Mapping, optional
        Extra environment variables; the SuperLink, the simulation process and the
        Ray workers inherit them (e.g. ``OMP_NUM_THREADS``).
    echo : bool or callable, default False
        Also print the run's log as it streams (a callable gets each line, e.g. the
        launcher's ``ProgressEcho``).
    heartbeat_timeout : float, optional
        Seconds the SuperLink waits for the ServerApp's heartbeat before it fails the
        run (at least 60; default: Flower's 60). Set through a ``flower-superlink``
        script under ``<flwr_home>/bin``, first on the ``PATH`` of ``flwr run``
        (`fedorasflwr.launch.heartbeat`).

    Returns
    -------
    RunResult
        The run's id, status, log and wall time.

    Raises
    ------
    FlowerRunError
        If the run did not start, timed out or did not finish as completed; the
        message carries the tail of the log.
    """
    _check_positive_int("num_supernodes", num_supernodes)
    if client_num_cpus is not None:
        _check_positive_int("client_num_cpus", client_num_cpus)
    if heartbeat_timeout is not None:
        heartbeat_timeout = check_heartbeat_timeout(heartbeat_timeout)
    home = Path(flwr_home).resolve() if flwr_home else Path(tempfile.mkdtemp(prefix="flwr-sim-"))
    http_port, control_port = _free_ports(2)
    run_env = _flower_env(home, env)
    warnings = run_env.get("PYTHONWARNINGS", "")
    run_env["PYTHONWARNINGS"] = ",".join(w for w in (warnings, RAY_TIP_FILTER) if w)
    run_env |= {
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(http_port),
        "FLWR_LOCAL_CONTROL_API_PORT": str(control_port),
    }
    if heartbeat_timeout is not None:  # `flwr run` starts the first flower-superlink on PATH
        run_env[HEARTBEAT_TIMEOUT_ENV] = repr(heartbeat_timeout)
        wrapper = superlink_wrapper(home / "bin")
        run_env["PATH"] = os.pathsep.join([str(wrapper), run_env["PATH"]])
    federation: dict[str, ConfigValue] = {"num-supernodes": num_supernodes}
    if client_num_cpus is not None:
        federation["client-resources-num-cpus"] = client_num_cpus
    federation |= dict(federation_config or {})
    try:
        _add_connection(home, SIMULATION_CONNECTION, {"address": ":local:"})
        log_file = home / "local-superlink" / "superlink.log"
        with packable_app(app_dir) as app:
            command = _run_command(app, SIMULATION_CONNECTION, run_config, federation)
            return _flwr_run(
                command,
                SIMULATION_CONNECTION,
                run_env,
                timeout,
                echo,
                [log_file],
                heartbeat_timeout=heartbeat_timeout,
            )
    finally:
        with held_signals():  # a SIGTERM now must not leave some of them running
            _stop_flower_processes(home)
            if flwr_home is None:
                shutil.rmtree(home, ignore_errors=True)
