"""Run the app on a local deployment engine: one SuperLink and N SuperNodes.

By default the SuperLink serves TLS and admits only registered SuperNodes (their
public keys registered with ``flwr supernode register``), with throwaway certificates
and keys made for localhost unless given; ``insecure=True`` turns both off.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import astuple
from pathlib import Path
from types import TracebackType

from .fab import packable_app
from .flwr_cli import (
    DEPLOYMENT_CONNECTION,
    ConfigValue,
    FlowerRunError,
    RunResult,
    _add_connection,
    _check_positive_int,
    _file_tail,
    _flower_env,
    _flower_tool,
    _flwr_run,
    _run_command,
    format_run_config,
)
from .heartbeat import HEARTBEAT_TIMEOUT_ENV, check_heartbeat_timeout
from .processes import (
    LOOPBACK,
    free_port,
    held_signals,
    stop_pids,
)
from .security import NodeKey, TlsFiles, make_node_key, make_tls_files, node_key

__all__ = ["Deployment"]

#: read by Flower's ``flower-superexec`` (``flwr/supercore/superexec/run_superexec.py``)
SUPEREXEC_POLL_ENV = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"

#: how often the SuperLink's own SuperExec asks for a ServerApp to start, in seconds. It
#: starts one process per run, so a slower poll costs at most this once per run; at the
#: nodes' 0.1 s its polls were most of an idle deployment's CPU (`benchmarks/idle_cpu.py`)
SUPERLINK_POLL_INTERVAL = 0.5


class Deployment:
    """A real deployment engine on localhost: one SuperLink and N SuperNodes.

    Use as a context manager; ``run`` submits the app through the connection
    ``local-deployment`` written into ``$FLWR_HOME/config.toml``.

    Parameters
    ----------
    num_supernodes : int
        Number of ``flower-supernode`` processes.
    node_configs : Sequence[Mapping], optional
        Per node, extra ``--node-config`` entries added to ``partition-id=i
        num-partitions=N num-threads=T`` (T: ``cpu_count // num_supernodes``, at
        least 1; the ClientApp sets torch's thread count to it).
    flwr_home : Path, optional
        ``FLWR_HOME`` of the SuperLink (each node gets ``<flwr_home>/supernode-<i>``);
        default: a temporary directory, removed on exit.
    env : Mapping, optional
        Extra environment variables for every process (ClientApps inherit them).
        Unless it or the caller's environment sets ``OMP_NUM_THREADS``, each process
        gets ``cpu_count // num_supernodes`` threads (at least 1): the nodes share
        this host's cores.
    startup_timeout : float, default 60.0
        Seconds to wait for the SuperLink to be healthy and every node online.
    insecure : bool, default False
        Plain HTTP and no SuperNode authentication (Flower's ``--insecure``).
    tls : TlsFiles, optional
        The SuperLink's CA certificate, certificate and key; default (unless
        ``insecure``): throwaway ones for 127.0.0.1 under ``<flwr_home>/certs``.
    supernode_auth : bool, default True
        Start the SuperLink with ``--enable-supernode-auth`` and register each node's
        public key before starting it (needs TLS).
    node_keys : Sequence[Path], optional
        One OpenSSH EC private key per SuperNode; default: throwaway P-384 keys under
        ``<flwr_home>/keys``.
    warm_clientapps : bool, default True
        Each SuperNode runs with ``--isolation process`` next to a warm executor
        (``python -m fedorasflwr.launch.warm``) that has imported torch and Flower's
        ClientApp runtime once and forks a child per message, instead of Flower's
        ``flower-superexec`` starting a fresh ``flwr-clientapp`` process per message.
        TLS to the SuperLink and SuperNode authentication are the SuperNode's and do
        not change.  ``False``: Flower's own per-message processes.
    clientapp_slots : int, optional
        With warm ClientApps: at most this many run at once among this deployment's
        nodes, whichever node they belong to (`fedorasflwr.launch.warm.TaskSlots`, under
        ``<flwr_home>/clientapp-slots``: a node's message waits at its SuperNode for a
        free slot, as the simulation engine's Ray waits for a free CPU). Default:
        ``cpu_count // threads_per_node(num_supernodes)`` (the ``num-threads`` each node
        gets unless ``node_configs`` sets its own), so the nodes' trainers do not share
        cores; ``0``: no limit (every message at once). Cold ClientApps
        (``warm_clientapps=False``) are Flower's own processes: never limited.
    heartbeat_timeout : float, optional
        Seconds the SuperLink waits for the ServerApp's heartbeat before it fails the
        run (at least 60; default: Flower's 60): the SuperLink then runs as
        ``python -m fedorasflwr.launch.superlink`` (`fedorasflwr.launch.heartbeat`).
    prompt_supernodes : bool, default True
        Each SuperNode runs as ``python -m fedorasflwr.launch.supernode``: Flower's
        ``flower-supernode`` whose wait after an empty pull starts at 0.1 s once a reply
        has gone out and grows back to Flower's 3 s (`fedorasflwr.launch.supernode`), so a
        round's messages are pulled promptly. ``False``: ``flower-supernode`` itself.
    """

    def __init__(
        self,
        *,
        num_supernodes: int,
        node_configs: Sequence[Mapping[str, ConfigValue]] | None = None,
        flwr_home: Path | None = None,
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 60.0,
        insecure: bool = False,
        tls: TlsFiles | None = None,
        supernode_auth: bool = True,
        node_keys: Sequence[Path] | None = None,
        heartbeat_timeout: float | None = None,
        warm_clientapps: bool = True,
        clientapp_slots: int | None = None,
        prompt_supernodes: bool = True,
    ) -> None:
        _check_positive_int("num_supernodes", num_supernodes)
        if clientapp_slots is None:
            clientapp_slots = max(1, (os.cpu_count() or 1) // threads_per_node(num_supernodes))
        if isinstance(clientapp_slots, bool) or not isinstance(clientapp_slots, int):
            raise ValueError(f"clientapp_slots: {clientapp_slots!r}; expected an integer >= 0")
        if clientapp_slots < 0:
            raise ValueError(f"clientapp_slots: {clientapp_slots}; expected >= 0 (0: no limit)")
        self.clientapp_slots = clientapp_slots
        if heartbeat_timeout is not None:
            heartbeat_timeout = check_heartbeat_timeout(heartbeat_timeout)
        self.heartbeat_timeout = heartbeat_timeout
        if node_configs is not None and len(node_configs) != num_supernodes:
            raise ValueError(
                f"node_configs has {len(node_configs)} entries for {num_supernodes} supernodes"
            )
        _check_security(num_supernodes, insecure, tls, supernode_auth, node_keys)
        self.insecure = insecure
        # Absolute: Flower's config.toml refuses a relative root-certificates path.
        self.tls = TlsFiles(*(Path(f).resolve() for f in astuple(tls))) if tls else None
        self.supernode_auth = supernode_auth and not insecure
        self._given_keys = [Path(k).resolve() for k in node_keys] if node_keys else None
        self.node_keys: list[NodeKey] = []
        self.node_ids: list[int] = []
        self.num_supernodes = num_supernodes
        self.node_configs = list(node_configs or [{}] * num_supernodes)
        self._given_home = Path(flwr_home).resolve() if flwr_home else None
        self._extra_env = dict(env or {})
        if heartbeat_timeout is not None:  # read by the SuperLink `_start_superlink` starts
            self._extra_env[HEARTBEAT_TIMEOUT_ENV] = repr(heartbeat_timeout)
        self.startup_timeout = startup_timeout
        self.warm_clientapps = warm_clientapps
        self.prompt_supernodes = prompt_supernodes
        self.flwr_home = Path()
        self.port = 0
        self.processes: list[subprocess.Popen[bytes]] = []
        self.supernodes: list[subprocess.Popen[bytes]] = []
        self.log_files: list[Path] = []

    def __enter__(self) -> Deployment:
        """Start the SuperLink and the SuperNodes and wait until all nodes are online."""
        self.port = free_port()
        self.flwr_home = self._given_home or Path(tempfile.mkdtemp(prefix="flwr-deploy-"))
        (self.flwr_home / "logs").mkdir(parents=True, exist_ok=True)
        try:
            self._prepare_security()
            self._start_superlink()
            self._wait(self._superlink_healthy, "the SuperLink to answer /health")
            connection: dict[str, object] = {"address": f"{LOOPBACK}:{self.port}"}
            if self.tls is None:
                connection["insecure"] = True
            else:
                connection["root-certificates"] = str(self.tls.ca_cert)
            _add_connection(self.flwr_home, DEPLOYMENT_CONNECTION, connection)
            if self.supernode_auth:
                self.node_ids = self.register([key.public_key for key in self.node_keys])
            for index in range(self.num_supernodes):
                key = self.node_keys[index].private_key if self.supernode_auth else None
                self.start_supernode(f"supernode-{index}", self._node_config(index), key)
            self._wait(self._nodes_online, f"{self.num_supernodes} SuperNodes to be online")
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Stop every process and remove the temporary ``FLWR_HOME``."""
        self.stop()

    def run(
        self,
        app_dir: Path,
        run_config: Mapping[str, ConfigValue] | str | None = None,
        timeout: float | None = None,
        echo: bool = False,
    ) -> RunResult:
        """Run the app on this deployment: ``flwr run <app_dir> local-deployment --stream``.

        Raises
        ------
        FlowerRunError
            If the run did not start, timed out or did not finish as completed; the
            message carries the tails of the run, SuperLink and SuperNode logs.
        """
        env = self._env(self.flwr_home)
        with packable_app(app_dir) as app:
            command = _run_command(app, DEPLOYMENT_CONNECTION, run_config)
            return _flwr_run(
                command,
                DEPLOYMENT_CONNECTION,
                env,
                timeout,
                echo,
                self.log_files,
                heartbeat_timeout=self.heartbeat_timeout,
            )

    def stop(self) -> None:
        """Stop all processes started here (then any stragglers) and remove a temp home."""
        if not self.port:  # not started, or already stopped
            return
        with held_signals():  # a SIGTERM now must not leave some of them running
            # all at once, their groups and any process under the home: one grace for all
            stop_pids([process.pid for process in self.processes], flwr_home=self.flwr_home)
            for process in self.processes:
                process.wait()
            self.processes.clear()
            self.supernodes.clear()
            if self._given_home is None:
                shutil.rmtree(self.flwr_home, ignore_errors=True)
            self.port = 0

    def _env(self, flwr_home: Path, *, superlink: bool = False) -> dict[str, str]:
        env = _flower_env(flwr_home, self._extra_env)
        # N SuperNodes on one host share its cores.  Each ClientApp is a fresh process
        # whose torch would otherwise start one thread per core: oversubscribed OpenMP
        # threads spin against each other and every training step gets many times slower.
        if "OMP_NUM_THREADS" not in os.environ and "OMP_NUM_THREADS" not in self._extra_env:
            env["OMP_NUM_THREADS"] = str(threads_per_node(self.num_supernodes))
        # Flower's SuperExecs poll for a task every second by default: up to a second before
        # a message's process starts on a node that is not warm, so the nodes' poll faster;
        # the SuperLink's starts one ServerApp per run and polls at SUPERLINK_POLL_INTERVAL
        # (imported here: `python -m fedorasflwr.launch.warm` must find it not yet imported)
        from .warm import DEFAULT_POLL_INTERVAL

        interval = SUPERLINK_POLL_INTERVAL if superlink else DEFAULT_POLL_INTERVAL
        env.setdefault(SUPEREXEC_POLL_ENV, repr(interval))
        return env

    def _spawn(
        self, command: list[str], name: str, flwr_home: Path, *, superlink: bool = False
    ) -> subprocess.Popen[bytes]:
        log_file = self.flwr_home / "logs" / f"{name}.log"
        with log_file.open("wb") as sink:
            process = subprocess.Popen(
                command,
                env=self._env(flwr_home, superlink=superlink),
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes.append(process)
        self.log_files.append(log_file)
        return process

    def register(self, public_keys: Sequence[Path]) -> list[int]:
        """Register SuperNode public keys: ``flwr supernode register <key.pub>
        local-deployment``, all at once; returns the node ids the SuperLink gave them."""
        commands = [
            [_flower_tool("flwr"), "supernode", "register", str(key), DEPLOYMENT_CONNECTION]
            + ["--format", "json"]
            for key in public_keys
        ]
        env = self._env(self.flwr_home)
        running = [
            subprocess.Popen(
                c, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            for c in commands
        ]
        node_ids = []
        for key, process in zip(public_keys, running, strict=True):
            output, _ = process.communicate(timeout=self.startup_timeout)
            try:
                answer = json.loads(output[output.find("{") :])
                node_ids.append(int(answer["node-id"]))
            except (json.JSONDecodeError, KeyError, ValueError):
                raise FlowerRunError(f"registering {key} failed:\n{output.strip()}") from None
        return node_ids

    def start_supernode(
        self, name: str, node_config: Mapping[str, ConfigValue], private_key: Path | None = None
    ) -> subprocess.Popen[bytes]:
        """Start one ``flower-supernode`` (``FLWR_HOME`` ``<flwr_home>/<name>``, log
        ``<flwr_home>/logs/<name>.log``) signing in with ``private_key`` if given."""
        node_home = self.flwr_home / name
        node_home.mkdir(exist_ok=True)
        command = [_flower_tool("flower-supernode")]
        if self.prompt_supernodes:  # the same SuperNode, its waits shortened
            command = [sys.executable, "-m", "fedorasflwr.launch.supernode"]
        command += ["--superlink", f"{LOOPBACK}:{self.port}"]
        if self.tls is None:
            command += ["--insecure"]
        else:
            command += ["--root-certificates", str(self.tls.ca_cert)]
        if private_key is not None:
            command += ["--auth-supernode-private-key", str(private_key)]
        runtime_port = free_port()
        command += ["--host", LOOPBACK, "--port", str(runtime_port)]
        command += ["--node-config", format_run_config(node_config)]
        if self.warm_clientapps:
            command += ["--isolation", "process"]
        process = self._spawn(command, name, node_home)
        self.supernodes.append(process)
        if self.warm_clientapps:
            # the node's ClientApp tasks: its Runtime API is plain HTTP on loopback, as
            # the SuperExec it would otherwise start itself uses (`fedorasflwr.launch.warm`)
            warm = [sys.executable, "-m", "fedorasflwr.launch.warm", "--insecure"]
            warm += ["--runtime-api-address", f"{LOOPBACK}:{runtime_port}"]
            warm += ["--parent-pid", str(process.pid)]
            if self.clientapp_slots:  # one set of slots for every node of this host
                slots = self.flwr_home / "clientapp-slots"
                warm += ["--task-slots", str(self.clientapp_slots), "--task-slots-dir", str(slots)]
            self._spawn(warm, f"{name}-clientapps", node_home)
        return process

    def _prepare_security(self) -> None:
        if self.insecure:
            return
        if self.tls is None:
            self.tls = make_tls_files(self.flwr_home / "certs")
        self.tls.check()
        if not self.supernode_auth:
            return
        keys = self.flwr_home / "keys"
        if self._given_keys is not None:
            self.node_keys = [node_key(path, keys) for path in self._given_keys]
        else:
            self.node_keys = [
                make_node_key(keys, f"supernode-{i}") for i in range(self.num_supernodes)
            ]

    def _node_config(self, index: int) -> dict[str, ConfigValue]:
        node_config: dict[str, ConfigValue] = {
            "partition-id": index,
            "num-partitions": self.num_supernodes,
            "num-threads": threads_per_node(self.num_supernodes),
        }
        return node_config | dict(self.node_configs[index])

    def _start_superlink(self) -> None:
        command = [_flower_tool("flower-superlink")]
        if self.heartbeat_timeout is not None:  # flower-superlink with a longer task timeout
            command = [sys.executable, "-m", "fedorasflwr.launch.superlink"]
        if self.tls is None:
            command += ["--insecure"]
        else:
            command += ["--ssl-ca-certfile", str(self.tls.ca_cert)]
            command += ["--ssl-certfile", str(self.tls.server_cert)]
            command += ["--ssl-keyfile", str(self.tls.server_key)]
        if self.supernode_auth:
            command += ["--enable-supernode-auth"]
        command += ["--disable-runtime-dependency-installation"]
        command += ["--host", LOOPBACK, "--port", str(self.port)]
        self._spawn(command, "superlink", self.flwr_home, superlink=True)

    def _wait(self, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while not ready():
            dead = [p.args for p in self.processes if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                reason = f"exited: {dead[0]}" if dead else f"{self.startup_timeout}s passed"
                logs = "\n".join(_file_tail(path, 20) for path in self.log_files)
                raise FlowerRunError(f"gave up waiting for {what} ({reason})\n{logs}")
            time.sleep(0.5)

    def _superlink_healthy(self) -> bool:
        if self.tls is None:
            url, context = f"http://{LOOPBACK}:{self.port}/health", None
        else:
            url = f"https://{LOOPBACK}:{self.port}/health"
            context = ssl.create_default_context(cafile=str(self.tls.ca_cert))
        try:
            with urllib.request.urlopen(url, timeout=1, context=context):
                return True
        except (urllib.error.URLError, OSError):
            return False

    def _nodes_online(self) -> bool:
        online = [node for node in self.list_nodes() if node.get("status") == "online"]
        return len(online) >= self.num_supernodes

    def list_nodes(self) -> list[dict[str, object]]:
        """The SuperLink's node list (``flwr supernode ls --format json``); ``[]`` if
        it did not answer."""
        command = [_flower_tool("flwr"), "supernode", "ls", DEPLOYMENT_CONNECTION]
        command += ["--format", "json"]
        result = subprocess.run(
            command, env=self._env(self.flwr_home), capture_output=True, text=True, timeout=60
        )
        try:
            nodes = json.loads(result.stdout[result.stdout.find("{") :]).get("nodes", [])
        except json.JSONDecodeError:
            return []
        return list(nodes)


def threads_per_node(supernodes_on_host: int) -> int:
    """torch threads per SuperNode that cannot oversubscribe this host's cores."""
    return max(1, (os.cpu_count() or 1) // supernodes_on_host)


def _check_security(
    num_supernodes: int,
    insecure: bool,
    tls: TlsFiles | None,
    supernode_auth: bool,
    node_keys: Sequence[Path] | None,
) -> None:
    """Refuse contradictory security settings with what is allowed."""
    if insecure and (tls is not None or node_keys):
        raise ValueError(
            "insecure=True turns TLS and SuperNode authentication off: "
            "do not also pass tls or node_keys"
        )
    if node_keys and not supernode_auth:
        raise ValueError("node_keys given with supernode_auth=False: pass one or the other")
    if node_keys is not None and len(node_keys) != num_supernodes:
        raise ValueError(f"node_keys has {len(node_keys)} keys for {num_supernodes} supernodes")
