"""Run this Flower app on a real engine (simulation or local deployment) and clean up.

The one implementation of "start Flower, run the app, stop everything", used by the
README's run command (``python -m fedorasflwr.launch``), the engine tests and the
benchmarks.

Facts about Flower 1.41 this package relies on:

- ``flwr run <app> --stream`` with the ``:local:`` connection starts a *detached*
  ``flower-superlink --simulation`` on ``$FLWR_LOCAL_SUPERLINK_HTTP_API_PORT`` (one HTTP
  port for the Control, Fleet and Runtime APIs) and leaves it running. It logs to
  ``$FLWR_HOME/local-superlink/superlink.log``; its ``flower-superexec`` child runs in a
  session of its own and starts ``flwr-simulation`` (Ray) or ``flwr-serverapp``. All of
  them inherit the environment of ``flwr run``, so they are found by their ``FLWR_HOME``.
- ``flwr run --stream`` exits with 0 even when the ServerApp raised; the run's status
  (``finished:completed`` / ``finished:failed`` and details) comes from
  ``flwr ls --run-id <id> --format json``.
- The SuperLink fails a running ServerApp task it has heard no heartbeat from for
  ``HEARTBEAT_PATIENCE * HEARTBEAT_DEFAULT_INTERVAL`` = 60 s, module constants with no
  option; `heartbeat` starts a SuperLink with a longer timeout.
- Unless ``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1`` (or
  ``--disable-runtime-dependency-installation``) reaches the SuperLink, every run
  builds a fresh environment with ``uv sync`` and downloads all dependencies.
  SuperNodes install nothing unless given ``--allow-runtime-dependency-installation``.
  Both engines unpack the FAB under ``$FLWR_HOME/apps`` and import the app from there.

The package's parts: `processes` (free ports, finding and stopping processes, SIGTERM and
SIGHUP turned into Ctrl-C's clean-up: `stop_on_signals`),
`flwr_cli` (run configs, the Flower environment, ``flwr run`` / ``flwr ls``), `heartbeat`
(the SuperLink's task heartbeat timeout) and `superlink` (``flower-superlink`` with it set),
`supernode` (``flower-supernode`` pulling a round's messages promptly), `warm` (the warm
ClientApp executor),
`fab` (the copy of the app ``flwr run`` packs: `packable_app`),
`simulation` (`run_simulation`), `deployment` (`Deployment`), `security` (TLS
certificates and SuperNode keys: `TlsFiles`, `make_tls_files`, `make_node_key`) and
`cli` (``python -m fedorasflwr.launch``).
"""

from .cli import main
from .deployment import Deployment
from .flwr_cli import DEPLOYMENT_CONNECTION as DEPLOYMENT_CONNECTION
from .flwr_cli import QUIET_FLOWER_ENV as QUIET_FLOWER_ENV
from .flwr_cli import SIMULATION_CONNECTION as SIMULATION_CONNECTION
from .flwr_cli import ConfigValue, FlowerRunError, RunResult, format_run_config
from .processes import LOOPBACK as LOOPBACK
from .processes import Stopped, find_pids, free_port, stop_on_signals, stop_pids
from .security import NodeKey, TlsFiles, make_node_key, make_tls_files
from .simulation import run_simulation

__all__ = [
    "DEPLOYMENT_CONNECTION",
    "ConfigValue",
    "Deployment",
    "FlowerRunError",
    "NodeKey",
    "RunResult",
    "Stopped",
    "TlsFiles",
    "find_pids",
    "format_run_config",
    "free_port",
    "main",
    "make_node_key",
    "make_tls_files",
    "run_simulation",
    "stop_on_signals",
    "stop_pids",
]
