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
    SUPERLINK_START_TIMEOUT,
    ConfigValue,
    FlowerRunError,
    HeldBox,
    RunResult,
    _add_connection,
    _check_positive_int,
    _flower_env,
    _flwr_run,
    _run_command,
)
from .heartbeat import HEARTBEAT_TIMEOUT_ENV, check_heartbeat_timeout, superlink_wrapper
from .processes import _free_ports, _stop_flower_processes, held_signals

__all__ = ["RAY_TIP_FILTER", "SUPERLINK_START_ATTEMPTS", "ray_env", "run_simulation"]

#: tries of ``flwr run`` whose local SuperLink missed Flower's 15-s start limit (seen twice
#: in a row at load 22-30); a start that failed otherwise is not tried again
SUPERLINK_START_ATTEMPTS = 3

#: Set to ``0``, Ray keeps a loopback address as given instead of replacing it with the
#: host's network address (named for Windows / macOS, where it is off by default).
RAY_CLUSTER_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
#: Ray refuses these when it joins a running cluster: the cluster's nodes declare them.
_CLUSTER_OWNED = ("init-args-num-cpus", "init-args-num-gpus")

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
    ray_address: str | None = None,
) -> RunResult:
    """Run the Flower app in `app_dir` on the simulation engine, then stop all of Flower.

    Runs ``flwr run <app_dir> local --stream --federation-config "num-supernodes=N ..."``
    against a local SuperLink on free loopback ports, checks the run's final status
    and always stops that SuperLink and its children (also on error, timeout and
    KeyboardInterrupt, and SIGTERM / SIGHUP under `stop_on_signals`). A local SuperLink
    that missed Flower's 15-s start limit (a loaded machine) is started again, up to
    `SUPERLINK_START_ATTEMPTS` tries; Flower's error box is shown once, by the last.

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
    ray_address : str, optional
        ``HOST:PORT`` of a running Ray cluster's head (``ray start --head``): the
        simulation joins it instead of starting a Ray instance of its own, and its
        ClientApps run on the cluster's nodes (docs/scaling.md). The cluster is not
        stopped afterwards. ``init-args-num-cpus`` / ``-num-gpus`` are refused with it
        (the cluster's nodes declare their resources).

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
    federation: dict[str, ConfigValue] = {"num-supernodes": num_supernodes}
    if client_num_cpus is not None:
        federation["client-resources-num-cpus"] = client_num_cpus
    federation |= dict(federation_config or {})
    cluster = {} if ray_address is None else ray_env(ray_address)
    if cluster:
        owned = [key for key in _CLUSTER_OWNED if key in federation]
        if owned:
            raise ValueError(
                f"federation config {owned[0]}={federation[owned[0]]!r} cannot be combined with "
                f"ray_address={ray_address!r}: a Ray cluster's nodes declare their own "
                "resources (set them with `ray start --num-cpus/--num-gpus`)"
            )
    home = Path(flwr_home).resolve() if flwr_home else Path(tempfile.mkdtemp(prefix="flwr-sim-"))
    http_port, control_port = _free_ports(2)
    run_env = _flower_env(home, {**dict(env or {}), **cluster})
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
    try:
        _add_connection(home, SIMULATION_CONNECTION, {"address": ":local:"})
        log_file = home / "local-superlink" / "superlink.log"
        with packable_app(app_dir) as app:
            command = _run_command(app, SIMULATION_CONNECTION, run_config, federation)
            for attempt in range(1, SUPERLINK_START_ATTEMPTS + 1):
                held = HeldBox(echo)  # Flower's error box: shown by the last try only
                try:
                    return _flwr_run(
                        command,
                        SIMULATION_CONNECTION,
                        run_env,
                        timeout,
                        held,
                        [log_file],
                        heartbeat_timeout=heartbeat_timeout,
                    )
                except FlowerRunError as error:
                    if attempt == SUPERLINK_START_ATTEMPTS or not _missed_start_limit(error):
                        raise
                    held.drop()
                    held(
                        f"{SUPERLINK_START_TIMEOUT.search(str(error))[0]} (a loaded machine?): "
                        f"trying again ({attempt + 1} of {SUPERLINK_START_ATTEMPTS})\n"
                    )
                    _stop_flower_processes(home)  # what the failed start left
                finally:
                    held.release()
            raise AssertionError("unreachable: the last attempt returns or raises")
    finally:
        with held_signals():  # a SIGTERM now must not leave some of them running
            _stop_flower_processes(home)
            if flwr_home is None:
                shutil.rmtree(home, ignore_errors=True)


def _missed_start_limit(error: FlowerRunError) -> bool:
    """Whether `flwr run` failed only because its local SuperLink was not up within
    Flower's start limit (no run started): worth another try."""
    return error.run_id is None and SUPERLINK_START_TIMEOUT.search(str(error)) is not None


def ray_env(address: str) -> dict[str, str]:
    """Environment that makes Flower's Ray backend join the cluster at ``address``.

    Flower 1.41's federation config passes only CPUs, GPUs and logging to ``ray.init``,
    which reads ``RAY_ADDRESS`` when no address is given. A loopback head (a single-host
    cluster, as in the tests) also needs :data:`RAY_CLUSTER_ENV` = ``0``: otherwise Ray
    swaps ``127.0.0.1`` for the host's network address, where a loopback head is not
    listening. Raises ``ValueError`` for an address that is not ``HOST:PORT``.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"ray_address={address!r}: expected HOST:PORT of a Ray head "
            "(the address `ray start --head` prints), e.g. 10.0.0.5:6379"
        )
    env = {"RAY_ADDRESS": address}
    if host in _LOOPBACK_HOSTS:
        env[RAY_CLUSTER_ENV] = "0"
    return env
