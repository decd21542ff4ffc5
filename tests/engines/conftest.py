"""Fixtures that run the project's Flower app on real engines (see `fedorasflwr.launch`)."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from fedorasflwr.launch import (
    LOOPBACK,
    ConfigValue,
    Deployment,
    RunResult,
    TlsFiles,
    find_pids,
    make_node_key,
    make_tls_files,
    run_simulation,
    stop_pids,
)
from fedorasflwr.launch.flwr_cli import _flower_env
from fedorasflwr.launch.processes import _free_ports, _stop_flower_processes
from tests.runconfig import readme_run_command, tiny_fedoras

TIMING_LOG_ENV = "FEDORASFLWR_TIMING_LOG"  # fedorasflwr.client_app.TIMING_LOG_ENV

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TIMEOUT = 1800.0
#: the README's default search: about 5 minutes alone on 2 cores, but it starts first and
#: shares the cores with two more workers' engine runs (a limit against a hang, not a goal;
#: on 2026-12-02's slower 2-core machine it took 814 s beside one other engine module, 868 s
#: in CI's run beside two more workers; the 1800 s this limit was is the likeliest cause of
#: the two errors among the first engine tests of an earlier CI run, whose names it never printed)
README_TIMEOUT = 3600.0


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


@pytest.fixture(scope="module")
def module_simulation_runner(
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[..., tuple[RunResult, Path]]:
    """`simulation_runner` for one run that several tests of a module share (call it from a
    module-scoped fixture): ``run(num_supernodes=6, ...)`` -> ``(result, flwr_home)``.

    Every call gets a fresh ``FLWR_HOME`` of its own under pytest's temp dirs (so calls may
    run at once, from threads); ``app_dir`` runs another Flower app than the project's.
    """

    def run(
        *,
        app_dir: Path = PROJECT_ROOT,
        num_supernodes: int = 4,
        run_config: Mapping[str, ConfigValue] | str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        **kwargs: object,
    ) -> tuple[RunResult, Path]:
        home = tmp_path_factory.mktemp("flwr-home")
        result = run_simulation(
            app_dir,
            num_supernodes=num_supernodes,
            run_config=run_config,
            flwr_home=home,
            timeout=timeout,
            **kwargs,  # type: ignore[arg-type]
        )
        return result, home

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


def flwr_ls(home: Path) -> list[dict]:
    """The runs ``flwr ls local --format json`` lists for the Flower home `home` of a
    finished launch, as Flower reports them (``run-id``, ``status``, ...). ``flwr ls``
    starts a SuperLink on free ports (another one may hold Flower's defaults); it is
    stopped before this returns."""
    http, control = _free_ports(2)
    ports = {
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(http),
        "FLWR_LOCAL_CONTROL_API_PORT": str(control),
    }
    env = _flower_env(home, ports)  # FLWR_HOME; the venv's bin on PATH: flwr starts a SuperLink
    flwr = str(Path(sys.executable).parent / "flwr")
    try:
        listed = subprocess.run(
            [flwr, "ls", "local", "--format", "json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        _stop_flower_processes(home)  # the SuperLink `flwr ls` started
    return list(json.loads(listed.stdout[listed.stdout.find("{") :])["runs"])


@dataclass(frozen=True)
class ReadmeRun:
    """The README's run command, run once: its process, working directory and ``FLWR_HOME``."""

    done: subprocess.CompletedProcess[str]
    cwd: Path
    flwr_home: Path


@pytest.fixture(scope="session")
def readme_run(tmp_path_factory: pytest.TempPathFactory) -> ReadmeRun:
    """The README's first command (the default search: 20 simulated clients, all three
    stages), run once per session as a new user types it, in a fresh working directory.

    The venv and the install of the README's line are ours; the rest must be exactly
    ``python -m fedorasflwr.launch``, which runs here with this interpreter, a temporary
    ``FLWR_HOME`` (so that what it leaves running can be found) and a fresh data cache.
    Several tests assert on this one run: it is the suite's most expensive.
    """
    command = readme_run_command().split("&& ")[-1].split()  # the venv and install are ours
    assert command == ["python", "-m", "fedorasflwr.launch"]
    cwd = tmp_path_factory.mktemp("readme-run")
    home = cwd / "flwr-home"
    env = dict(os.environ, FEDORASFLWR_CACHE=str(cwd / "cache"))
    argv = [sys.executable, *command[1:], "--app-dir", str(PROJECT_ROOT)]
    try:
        done = subprocess.run(
            [*argv, "--flwr-home", str(home)],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=README_TIMEOUT,
        )
    except subprocess.TimeoutExpired:  # the killed launcher cannot stop its Flower processes
        stop_pids(find_pids(flwr_home=home), grace=5.0)
        raise
    return ReadmeRun(done=done, cwd=cwd, flwr_home=home)


@dataclass(frozen=True)
class SecureDeploymentRun:
    """One tiny FedorAS run on the deployment engine as `Deployment` starts it by default:
    TLS with throwaway certificates, SuperNode authentication, a rogue SuperNode with an
    unregistered key trying to join, and a registered SuperNode killed in the middle of
    its Stage-1 round. What each test asserts is recorded here."""

    tls: TlsFiles
    superlink_args: list[str]
    supernode_args: list[list[str]]
    http_error: BaseException | None  # plain HTTP to the SuperLink's port
    https_error: BaseException | None  # HTTPS trusting the system CAs only
    rogue_exit: int | None  # the rogue SuperNode's exit code (None: still running)
    rogue_log: str
    superlink_log: str
    node_ids: list[int]
    listed: dict[int, str]  # `flwr supernode ls`: node id -> status
    run: RunResult
    result: dict
    left_running: list[int]  # Flower processes found after stop()
    victim_id: int  # the SuperNode killed mid-round (the last one)
    victim_killed: bool  # the watcher saw its Stage-1 message arrive and killed it
    victim_exit: int | None  # its exit code after the run (None: still running)
    warm_pids: list[int]  # the nodes' warm ClientApp executors (`fedorasflwr.launch.warm`)
    timings: list[dict]  # the ClientApp's timing log, one record per message handled
    flwr_home: Path  # the deployment's; each node's is <flwr_home>/supernode-<i>


def _urlopen_error(url: str, **kwargs: object) -> BaseException | None:
    try:
        urllib.request.urlopen(url, timeout=5, **kwargs)  # noqa: S310 - loopback only
    except Exception as error:  # noqa: BLE001 - the error is what the tests look at
        return error
    return None


#: the shared deployment run's SuperNodes: a budget above every tier and one below; the
#: third, of the first one's class and budget, is killed when its Stage-1 message arrives
NODE_CONFIGS = [
    {"device-class": "server", "latency-budget-ms": 1.0e6},
    {"device-class": "watch", "latency-budget-ms": 1.0e-6},
    {"device-class": "server", "latency-budget-ms": 1.0e6},
]
#: what a SuperNode logs when a Stage-1 message reaches it
SUPERNET_MESSAGE = "Receiving: train.fedoras_supernet message"


def kill_when_logged(pid: int, log_file: Path, text: str, killed: threading.Event) -> None:
    """SIGKILL the process group ``pid`` leads as soon as ``text`` is in ``log_file``."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if log_file.exists() and text in log_file.read_text(errors="replace"):
            os.killpg(pid, signal.SIGKILL)  # the SuperNode and its running ClientApp
            killed.set()
            return
        time.sleep(0.2)


@pytest.fixture(scope="session")
def secure_deployment_run(
    tmp_path_factory: pytest.TempPathFactory, data_cache: Path
) -> SecureDeploymentRun:
    """The deployment engine's one app run, shared by the tests of
    `test_secure_deployment.py`: the same app as on the simulation engine, TLS and
    SuperNode authentication, latency tables measured by the nodes, and a SuperNode lost
    mid-round (engine time is dear: these were three runs of the same tiny FedorAS)."""
    tmp = tmp_path_factory.mktemp("secure-deployment")
    timing_log = tmp / "timing.jsonl"  # one line per ClientApp message, with its parent
    tls = make_tls_files(tmp / "certs")
    keys = [make_node_key(tmp / "keys", f"node-{i}") for i in range(len(NODE_CONFIGS))]
    engine = Deployment(
        num_supernodes=len(NODE_CONFIGS),
        flwr_home=tmp / "flwr-home",
        tls=tls,
        node_keys=[key.private_key for key in keys],
        # Latency as FedorAS's resource (issue 16): each SuperNode measures its own table
        # and declares its device class and budget; the budgets place the nodes in the
        # top and the lowest tier.
        node_configs=NODE_CONFIGS,
        env={"FEDORASFLWR_CACHE": str(tmp / "node-cache"), TIMING_LOG_ENV: str(timing_log)},
    )
    engine.__enter__()
    try:
        superlink = list(engine.processes[0].args)
        warm_pids = [p.pid for p in engine.processes if "fedorasflwr.launch.warm" in p.args]
        supernodes = [list(node.args) for node in engine.supernodes]
        victim = engine.supernodes[-1]  # before the rogue joins the list
        http_error = _urlopen_error(f"http://{LOOPBACK}:{engine.port}/health")
        https_error = _urlopen_error(
            f"https://{LOOPBACK}:{engine.port}/health", context=ssl.create_default_context()
        )
        # A SuperNode with a key nobody registered: refused at sign-in, it exits.
        rogue_key = make_node_key(tmp / "rogue", "rogue")
        rogue = engine.start_supernode(
            "rogue", {"partition-id": 0, "num-partitions": len(keys)}, rogue_key.private_key
        )
        try:
            rogue_exit: int | None = rogue.wait(timeout=90)
        except subprocess.TimeoutExpired:
            rogue_exit = None
        logs = engine.flwr_home / "logs"
        rogue_log = (logs / "rogue.log").read_text(errors="replace")
        superlink_log = (logs / "superlink.log").read_text(errors="replace")
        # The last SuperNode dies (with its running ClientApp) once its Stage-1 message
        # arrives: the round must complete on the other two and book the loss to it once.
        killed = threading.Event()
        watcher = threading.Thread(
            target=kill_when_logged,
            args=(victim.pid, logs / f"supernode-{len(keys) - 1}.log", SUPERNET_MESSAGE, killed),
            daemon=True,
        )
        watcher.start()
        out = tmp / "out"
        config = tiny_fedoras(
            data_cache,
            **{
                "output-dir": str(out),
                "reply-timeout": 240.0,  # the SuperLink declares a node lost after ~60 s
                "fedoras.rounds": 1,
                "fedoras.clients-per-round": 3,
                "fedoras.min-replies": 1,  # the top tier fine-tunes on its one survivor
                "fedoras.finetune-clients-per-round": 2,
                # Stages 2 and 3 run for two tiers (their handlers, each message in a fresh
                # ClientApp process), tiers and paths in milliseconds of the nodes' tables.
                "fedoras.num-tiers": 2,
                # one NSGA-II generation per tier (its population): each scoring message
                # is a ClientApp process start, and more generations show nothing more here
                "fedoras.search-evaluations": 4,
                "fedoras.resource": "latency",
                "latency.repeats": 3,
                "latency.warmup": 1,
                "latency.validation-paths": 4,
            },
        )
        run = engine.run(PROJECT_ROOT, config, timeout=1800)
        watcher.join(timeout=1)
        victim_exit = victim.poll()
        listed = {int(node["node-id"]): node["status"] for node in engine.list_nodes()}
        (result_file,) = out.glob("fedoras-*/result.json")
        result = json.loads(result_file.read_text())
        node_ids = list(engine.node_ids)  # registered in SuperNode order
    finally:
        engine.stop()
    return SecureDeploymentRun(
        tls=tls,
        superlink_args=superlink,
        supernode_args=supernodes,
        http_error=http_error,
        https_error=https_error,
        rogue_exit=rogue_exit,
        rogue_log=rogue_log,
        superlink_log=superlink_log,
        node_ids=node_ids,
        listed=listed,
        run=run,
        result=result,
        left_running=find_pids(flwr_home=engine.flwr_home),
        victim_id=node_ids[-1],
        victim_killed=killed.is_set(),
        victim_exit=victim_exit,
        warm_pids=warm_pids,
        timings=[json.loads(line) for line in timing_log.read_text().splitlines()],
        flwr_home=engine.flwr_home,
    )
