"""Command line of ``python -m fedorasflwr.launch``."""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

from ..progress import RESULTS_LINE, ProgressEcho, launcher_env
from .deployment import Deployment
from .flwr_cli import (
    _ANSI_PATTERN,
    SIMULATION_CONNECTION,
    ConfigValue,
    FlowerRunError,
    format_run_config,
)
from .heartbeat import (
    DEFAULT_HEARTBEAT_TIMEOUT,
    HEARTBEAT_FAILURE,
    HEARTBEAT_TIMEOUT_ENV,
    check_heartbeat_timeout,
)
from .processes import Stopped, stop_on_signals
from .security import TlsFiles
from .simulation import ray_env, run_simulation
from .values import AppDirError, app_keys, check_run_values, read_app

__all__ = [
    "check_overrides",
    "failure_message",
    "interrupt_message",
    "main",
    "read_run_config",
    "resume_command",
]

#: the checkpoint a run directory holds (``fedorasflwr.checkpoints.CHECKPOINT_FILE``; not
#: imported, so that the launcher starts without loading torch)
CHECKPOINT_FILE = "checkpoint.pt"


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m fedorasflwr.launch",
        description="Run the Flower app on the simulation engine (default) or on a "
        "local deployment (SuperLink + SuperNodes), then stop every Flower process.",
    )
    parser.add_argument("--app-dir", type=Path, default=Path("."), help="default: .")
    parser.add_argument("--num-supernodes", type=int, default=20, help="default: 20")
    parser.add_argument(
        "--run-config",
        action="append",
        default=None,
        help='overrides, e.g. "k=1 s=\\"x\\"", or a TOML file such as configs/quick-fedoras.toml; '
        "repeat to apply several in order (later ones win)",
    )
    parser.add_argument("--deployment", action="store_true", help="use the deployment engine")
    parser.add_argument(
        "--cold-clientapps",
        action="store_true",
        help="with --deployment: Flower's own fresh flwr-clientapp process per message "
        "instead of a warm executor per SuperNode (docs/deployment.md)",
    )
    parser.add_argument(
        "--ray-address",
        default=None,
        metavar="HOST:PORT",
        help="simulation on a running Ray cluster: its head's address (`ray start --head`); "
        "every node needs this package installed and the data cache (docs/scaling.md)",
    )
    parser.add_argument(
        "--client-num-cpus",
        type=int,
        default=1,
        help="CPUs per simulated ClientApp (default: 1, so small models train in parallel)",
    )
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=Path("outputs"),
        help="where results go (default: ./outputs; made absolute, since the ServerApp "
        "runs in the SuperLink's working directory) unless --run-config sets output-dir; "
        "an app whose run config has no output-dir key gets only its Flower home there",
    )
    parser.add_argument(
        "--flwr-home",
        type=Path,
        default=None,
        help="FLWR_HOME of the run, kept so `flwr ls` / `flwr log` show it afterwards "
        "(default: a new <output-dir>/flwr-home/<UTC time>; never your own ~/.flwr)",
    )
    parser.add_argument("--timeout", type=float, default=None, help="seconds")
    parser.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds the SuperLink waits for the ServerApp's heartbeat before it fails "
        f"the run with {HEARTBEAT_FAILURE!r} (at least 60; default: "
        f"${HEARTBEAT_TIMEOUT_ENV}, else {DEFAULT_HEARTBEAT_TIMEOUT:g}; Flower's own is 60)",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show everything: Flower's DEBUG lines (Ray backend set-up), its FedAvg "
        "banner per training job and its per-round blocks",
    )
    _add_security_args(parser)
    args = parser.parse_args(argv)
    _check_security_args(parser, args)
    if args.cold_clientapps and not args.deployment:
        parser.error("--cold-clientapps is for --deployment")
    if args.ray_address is not None:
        if args.deployment:
            parser.error("--ray-address is for the simulation engine, not --deployment")
        try:
            ray_env(args.ray_address)
        except ValueError as error:
            parser.error(f"--ray-address: {error}")
    given = args.heartbeat_timeout
    if given is None:
        given = os.environ.get(HEARTBEAT_TIMEOUT_ENV) or DEFAULT_HEARTBEAT_TIMEOUT
    try:
        args.heartbeat_timeout = check_heartbeat_timeout(given)
    except ValueError as error:
        where = (
            "--heartbeat-timeout" if args.heartbeat_timeout is not None else HEARTBEAT_TIMEOUT_ENV
        )
        parser.error(f"{where}: {error}")
    return args


def _add_security_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "deployment security",
        "With --deployment the SuperLink serves TLS and admits only SuperNodes whose keys "
        "are registered; certificates and keys not given are made for localhost and "
        "thrown away (see docs/deployment.md).",
    )
    group.add_argument(
        "--insecure", action="store_true", help="no TLS and no SuperNode authentication"
    )
    group.add_argument("--ca-cert", type=Path, help="CA certificate (PEM) of the SuperLink's")
    group.add_argument("--server-cert", type=Path, help="the SuperLink's certificate (PEM)")
    group.add_argument("--server-key", type=Path, help="the SuperLink's private key (PEM)")
    group.add_argument(
        "--supernode-key",
        type=Path,
        action="append",
        help="OpenSSH EC private key of one SuperNode (ssh-keygen -t ecdsa -b 384); "
        "repeat once per SuperNode, in order; its public key is registered",
    )
    group.add_argument(
        "--no-supernode-auth",
        action="store_true",
        help="TLS, but admit any SuperNode (no --enable-supernode-auth)",
    )


def _check_security_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    tls = [args.ca_cert, args.server_cert, args.server_key]
    flags = ("--ca-cert", "--server-cert", "--server-key")
    given = [flag for flag, path in zip(flags, tls, strict=True) if path is not None]
    security = given or args.insecure or args.supernode_key or args.no_supernode_auth
    if security and not args.deployment:
        parser.error("the deployment security options need --deployment")
    if given and len(given) != 3:
        parser.error(f"TLS needs --ca-cert, --server-cert and --server-key; got only {given}")
    if args.insecure and (given or args.supernode_key or args.no_supernode_auth):
        parser.error("--insecure turns TLS and SuperNode authentication off: drop the others")
    if args.supernode_key and args.no_supernode_auth:
        parser.error("--supernode-key with --no-supernode-auth: pass one or the other")
    keys = args.supernode_key or []
    if keys and len(keys) != args.num_supernodes:
        parser.error(f"{len(keys)} --supernode-key for --num-supernodes {args.num_supernodes}")
    args.tls = TlsFiles(*tls) if given else None


def check_overrides(run_config: str, app_dir: Path | None = None) -> str | None:
    """Why the ``--run-config`` overrides cannot run (bad syntax, an unknown key), or ``None``.

    `run_config` is ``"k=v ..."`` or the path of a TOML file (Flower's rule: one that ends
    in ``.toml``). The keys are read with Flower's own parser and checked against the
    known keys of the app in `app_dir` (`fedorasflwr.launch.values.app_keys`; ``None``:
    this package's app), so a typo is named with the closest key before any Flower process
    starts (Flower would say only "Invalid run configuration").
    """
    try:
        known = None if app_dir is None else app_keys(read_app(app_dir))
        read_run_config([run_config], known)
    except ValueError as error:
        return str(error)
    return None


def read_run_config(
    items: Sequence[str], known: Collection[str] | None = None
) -> dict[str, ConfigValue]:
    """Merge ``--run-config`` items (``"k=v ..."`` strings or TOML files), later ones winning.

    `known`: the keys the app accepts (another Flower app's own ``[tool.flwr.app.config]``,
    `fedorasflwr.launch.values.app_keys`); ``None``: this package's run-config keys.

    Raises
    ------
    ValueError
        For a file that cannot be read or parsed, bad ``k=v`` syntax, a value that is not
        a str, int, float or bool (Flower's own check), or an unknown key (named with the
        closest known one).
    """
    from click import ClickException
    from flwr.common.config import parse_config_args

    from ..config import check_known_keys

    merged: dict[str, ConfigValue] = {}
    for item in items:
        where = f"file {item}" if item.endswith(".toml") else repr(item)
        try:
            values = parse_config_args([item])
        except ClickException as error:
            raise ValueError(error.format_message()) from error
        except OSError as error:
            raise ValueError(f"cannot read {where}: {error.strerror or error}") from error
        except ValueError as error:  # bad TOML, or a value that is not str/int/float/bool
            raise ValueError(f"{where}: {error}") from error
        try:
            check_known_keys(values, known)
        except ValueError as error:
            if not item.endswith(".toml"):
                raise
            raise ValueError(f"{where}: {error}") from error
        merged |= values
    return merged


def _flwr_home(args: argparse.Namespace, output_dir: Path) -> Path:
    """The run's Flower home: the one given, else a new one under the output directory."""
    if args.flwr_home is not None:
        return Path(args.flwr_home).resolve()
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    (output_dir / "flwr-home").mkdir(parents=True, exist_ok=True)
    for suffix in range(1, 1000):
        home = output_dir / "flwr-home" / (stamp if suffix == 1 else f"{stamp}-{suffix}")
        try:
            home.mkdir()  # atomic: two launchers started in the same second get two homes
        except FileExistsError:
            continue
        return home
    raise FileExistsError(f"no free Flower home under {output_dir / 'flwr-home'}")


def _how_to_see(home: Path, run_id: int | None) -> str:
    """How to list the runs of Flower home `home` and show the log of `run_id` (the
    log command only for a run that started)."""
    connection = SIMULATION_CONNECTION
    lines = [
        f"Flower home of this run: {home}",
        f"see it with:  FLWR_HOME={home} flwr ls {connection}",
    ]
    if run_id is not None:
        lines.append(f"              FLWR_HOME={home} flwr log {run_id} {connection} --show")
    lines.append(f'then stop the SuperLink they start:  pkill -f "{home}/local-superlink/"')
    return "\n".join(lines)


def failure_message(
    error: FlowerRunError,
    run_dir: Path | None,
    home: Path | None,
    argv: Sequence[str],
    values: Mapping[str, ConfigValue],
    cwd: Path,
) -> str:
    """What the launcher prints (after Flower's output) when the run failed: the error
    (its last lines: Flower's status, details and any remedy), the run id, the run
    directory and what is in it, and how to see the run's log.

    A run directory the ServerApp created but left empty (it was stopped before writing
    anything, e.g. by a heartbeat failure) is removed, and the message says so; one
    with a ``checkpoint.pt`` gets the command that resumes the run (`resume_command`).
    """
    lines = [f"FAILED: {error}", ""]
    run = f"run {error.run_id}" if error.run_id is not None else "the run (it did not start)"
    lines.append(f"{run}: {error.status or 'not finished'}; exit code 1")
    if run_dir is not None:
        if run_dir.is_dir() and not any(run_dir.iterdir()):
            run_dir.rmdir()
            lines.append(f"run directory {run_dir}: empty (nothing was written), removed")
        elif run_dir.is_dir():
            names = ", ".join(sorted(path.name for path in run_dir.iterdir())[:8])
            lines.append(f"run directory {run_dir}: kept ({names})")
            lines += _resume_lines(run_dir, argv, values, cwd)
    else:
        lines.append("no run directory was created")
    if home is not None:
        lines.append(_how_to_see(home, error.run_id))
    return "\n".join(lines)


class _RunWatch:
    """The launcher's echo of the run log, noting the run directory the ServerApp names
    (`fedorasflwr.progress.RESULTS_LINE`); called from the thread that reads the log."""

    def __init__(self, echo: Callable[[str], None]) -> None:
        self.echo = echo
        self.run_dir: Path | None = None

    def __call__(self, line: str) -> None:
        match = RESULTS_LINE.search(_ANSI_PATTERN.sub("", line))
        if match is not None:
            self.run_dir = Path(match["dir"])
        self.echo(line)


def resume_command(
    argv: Sequence[str], checkpoint: Path, values: Mapping[str, ConfigValue], cwd: Path
) -> str:
    """The shell command that resumes an interrupted launch: this launcher's own command
    line `argv` (run again in `cwd`, with this interpreter) plus ``--run-config
    'resume-from="<checkpoint>"'``, which wins over any earlier ``resume-from`` (later
    ``--run-config`` items win). A ``fedoras.resume-from`` in `values` (the merged run
    config) is emptied: it may not differ from ``resume-from``."""
    override: dict[str, ConfigValue] = {"resume-from": str(checkpoint)}
    if values.get("fedoras.resume-from"):
        override["fedoras.resume-from"] = ""
    command = [sys.executable, "-m", "fedorasflwr.launch", *argv]
    command += ["--run-config", format_run_config(override)]
    return f"cd {shlex.quote(str(cwd))} && {shlex.join(command)}"


def interrupt_message(
    stop: KeyboardInterrupt,
    run_dir: Path | None,
    argv: Sequence[str],
    values: Mapping[str, ConfigValue],
    cwd: Path,
) -> str:
    """What the launcher prints when Ctrl-C, SIGTERM or SIGHUP stopped it (after every
    Flower process it started is stopped): the signal, the run directory and the command
    that resumes the run from its ``checkpoint.pt`` (`resume_command`), on a line of its
    own to copy; without a checkpoint yet, that the same command starts over."""
    name = stop.name if isinstance(stop, Stopped) else "SIGINT"
    lines = [f"interrupted by {name}; every Flower process this launcher started is stopped"]
    if run_dir is None:
        lines.append("the run had not created its run directory yet: nothing to resume")
        return "\n".join(lines)
    lines.append(f"run directory: {run_dir}")
    return "\n".join(lines + _resume_lines(run_dir, argv, values, cwd))


def _resume_lines(
    run_dir: Path, argv: Sequence[str], values: Mapping[str, ConfigValue], cwd: Path
) -> list[str]:
    """How to resume the run of ``run_dir``: its checkpoint and the command on a line of its
    own (`resume_command`); without a checkpoint, that the same command starts over."""
    checkpoint = run_dir / CHECKPOINT_FILE
    if checkpoint.is_file():
        return [f"resume it from {checkpoint} with:", resume_command(argv, checkpoint, values, cwd)]
    return [f"no {CHECKPOINT_FILE} written yet: the same command starts the run over"]


def _print_err(text: str) -> None:
    """Print to stderr unless it is gone (SIGHUP: the terminal was closed)."""
    try:
        print(text, file=sys.stderr, flush=True)
    except OSError:
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; returns the process exit code: 0 for a run Flower reports
    ``finished:completed``, 1 for any other (the ServerApp raised, a heartbeat failure, a
    timeout: `failure_message`; ``flwr run --stream`` itself exits 0 for them), 2 for bad
    ``--run-config`` overrides: an unknown key or a value the ServerApp would refuse
    (`check_run_values`), found before any Flower process starts.

    Ctrl-C, SIGTERM and SIGHUP take one path (`stop_on_signals`): every Flower process
    started is stopped, the interrupt message names the run directory and the command
    that resumes it (`interrupt_message`), and the exit code is ``128 + signal``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parse_args(argv)
    try:
        known = app_keys(read_app(args.app_dir))
        values = read_run_config(args.run_config or [], known)
        values = check_run_values(args.app_dir, values, args.num_supernodes)
    except ValueError as error:
        where = "" if isinstance(error, AppDirError) else "--run-config: "
        print(f"error: {where}{error}", file=sys.stderr)
        return 2
    # The ServerApp runs in the SuperLink's working directory: make the output dir absolute
    # (only an app that has the key gets it: Flower refuses a key the app does not have).
    output_dir = Path(str(values.get("output-dir", args.output_dir))).resolve()
    if known is None or "output-dir" in known:
        values["output-dir"] = str(output_dir)
    run_config = format_run_config(values)
    home = None if args.deployment else _flwr_home(args, output_dir)
    env = launcher_env(args.verbose)
    echo = ProgressEcho(verbose_output=args.verbose)
    watch = _RunWatch(echo)
    with stop_on_signals():
        try:
            if args.deployment:
                with Deployment(
                    num_supernodes=args.num_supernodes,
                    flwr_home=args.flwr_home,
                    insecure=args.insecure,
                    tls=args.tls,
                    supernode_auth=not args.no_supernode_auth,
                    node_keys=args.supernode_key,
                    env=env,
                    heartbeat_timeout=args.heartbeat_timeout,
                    warm_clientapps=not args.cold_clientapps,
                ) as dep:
                    result = dep.run(args.app_dir, run_config, args.timeout, echo=watch)  # type: ignore[arg-type]
            else:
                result = run_simulation(
                    args.app_dir,
                    num_supernodes=args.num_supernodes,
                    run_config=run_config,
                    flwr_home=home,
                    client_num_cpus=args.client_num_cpus,
                    timeout=args.timeout,
                    echo=watch,
                    env=env,
                    federation_config={"verbose": True} if args.verbose else None,
                    heartbeat_timeout=args.heartbeat_timeout,
                    ray_address=args.ray_address,
                )
        except FlowerRunError as error:
            echo.close()
            message = failure_message(error, watch.run_dir, home, argv, values, Path.cwd())
            _print_err("\n" + message)
            return 1
        except KeyboardInterrupt as stop:  # Ctrl-C, SIGTERM, SIGHUP: processes stopped
            echo.close()
            cwd = Path.cwd()
            _print_err("\n" + interrupt_message(stop, watch.run_dir, argv, values, cwd))
            return 128 + (stop.signum if isinstance(stop, Stopped) else signal.SIGINT)
    echo.close()
    print(f"\nrun {result.run_id} {result.status} in {result.wall_time:.1f}s")
    if home is not None:
        print(_how_to_see(home, result.run_id))
    return 0
