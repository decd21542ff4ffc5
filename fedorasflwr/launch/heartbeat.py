"""The SuperLink's task heartbeat timeout: how long a ServerApp may go unheard before its
run is failed with ``No heartbeat received from the task``.

In Flower 1.41 the task that runs the ServerApp (``flwr-simulation`` on the simulation
engine, ``flwr-serverapp`` on a deployment) sends the SuperLink a heartbeat from a
background thread about every 20 s (``flwr.supercore.heartbeat.HeartbeatSender``). The
SuperLink's task store (``flwr.supercore.corestate``, in memory or SQL) fails a running
task it has not heard from for ``HEARTBEAT_PATIENCE * HEARTBEAT_DEFAULT_INTERVAL`` = 2 x
30 s = 60 s. Both are module constants with no option or environment variable; on a host
whose cores are all busy (many SuperNodes' trainings at once) a minute in which the
heartbeat thread got no heartbeat through fails an hour-long run.

``python -m fedorasflwr.launch.superlink [flower-superlink arguments]`` is
``flower-superlink`` with that timeout set from ``$FEDORASFLWR_HEARTBEAT_TIMEOUT``
(seconds; unset: Flower's 60 s). The launcher starts its SuperLinks through it: the
deployment's directly, the simulation's through a ``flower-superlink`` script first on the
``PATH`` of ``flwr run`` (`superlink_wrapper`), which is how ``flwr run`` finds the one it
starts. Only the task timeout changes: SuperNodes' heartbeats (a node lost after ~60 s)
keep Flower's rule.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

__all__ = [
    "DEFAULT_HEARTBEAT_TIMEOUT",
    "FLOWER_HEARTBEAT_TIMEOUT",
    "HEARTBEAT_FAILURE",
    "HEARTBEAT_TIMEOUT_ENV",
    "check_heartbeat_timeout",
    "heartbeat_remedy",
    "set_task_heartbeat_timeout",
    "superlink_wrapper",
]

#: environment variable read by the SuperLink this module starts (seconds)
HEARTBEAT_TIMEOUT_ENV = "FEDORASFLWR_HEARTBEAT_TIMEOUT"
#: Flower 1.41's own timeout: ``HEARTBEAT_PATIENCE * HEARTBEAT_DEFAULT_INTERVAL``
FLOWER_HEARTBEAT_TIMEOUT = 60.0
#: the launcher's default (``--heartbeat-timeout``): a loaded host's late heartbeats pass
DEFAULT_HEARTBEAT_TIMEOUT = 300.0
#: the run status details Flower writes when the timeout passed
HEARTBEAT_FAILURE = "No heartbeat received from the task"


def check_heartbeat_timeout(seconds: object) -> float:
    """``seconds`` as a float, or a `ValueError` naming it and what is allowed: a number
    of seconds at least Flower's own 60 (the task beats about every 20 s, and a retry
    after a failed beat waits up to 20 s more)."""
    try:
        value = float(seconds)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(
            f"heartbeat timeout {seconds!r} is not a number of seconds "
            f"(allowed: >= {FLOWER_HEARTBEAT_TIMEOUT:g})"
        ) from None
    if not value >= FLOWER_HEARTBEAT_TIMEOUT:  # also refuses nan
        raise ValueError(
            f"heartbeat timeout {seconds!r} s is below Flower's own "
            f"{FLOWER_HEARTBEAT_TIMEOUT:g} s (allowed: >= {FLOWER_HEARTBEAT_TIMEOUT:g})"
        )
    return value


def set_task_heartbeat_timeout(seconds: float) -> None:
    """Make this process's SuperLink fail a running task after `seconds` without a
    heartbeat (Flower: 60). Call it before the SuperLink starts; it sets
    ``HEARTBEAT_PATIENCE`` of both task stores (in memory, SQL), which they read at
    every heartbeat and expiry check."""
    from flwr.common.constant import HEARTBEAT_DEFAULT_INTERVAL
    from flwr.supercore.corestate import in_memory_corestate, sql_corestate

    patience = check_heartbeat_timeout(seconds) / HEARTBEAT_DEFAULT_INTERVAL
    for module in (in_memory_corestate, sql_corestate):
        if not hasattr(module, "HEARTBEAT_PATIENCE"):  # a Flower that moved it
            raise RuntimeError(f"{module.__name__} has no HEARTBEAT_PATIENCE to set")
        module.HEARTBEAT_PATIENCE = patience  # type: ignore[attr-defined]


def superlink_wrapper(directory: Path) -> Path:
    """Write ``<directory>/flower-superlink``, a script that runs
    ``fedorasflwr.launch.superlink`` with this interpreter, and return `directory`: put
    first on ``PATH``, it is the SuperLink ``flwr run`` starts for ``:local:``."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "flower-superlink"
    python = shlex.quote(sys.executable)
    script.write_text(f'#!/bin/sh\nexec {python} -m fedorasflwr.launch.superlink "$@"\n')
    script.chmod(0o755)
    return directory


def heartbeat_remedy(timeout: float | None) -> str:
    """What the launcher prints under a run that failed with `HEARTBEAT_FAILURE`."""
    used = FLOWER_HEARTBEAT_TIMEOUT if timeout is None else timeout
    return (
        f"the SuperLink heard nothing from the ServerApp's process for {used:g} s and failed "
        "the run: usually a host whose cores are all busy (the ServerApp's heartbeat "
        "thread got no CPU in time), sometimes a ServerApp process that died. Rerun with "
        f"a longer timeout (--heartbeat-timeout {max(2 * used, DEFAULT_HEARTBEAT_TIMEOUT):g}, "
        f"or {HEARTBEAT_TIMEOUT_ENV}), fewer --num-supernodes or a larger "
        "--client-num-cpus (fewer trainings at once)."
    )
