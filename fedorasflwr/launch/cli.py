"""Command line of ``python -m fedorasflwr.launch``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ..progress import ProgressEcho, launcher_env
from .deployment import Deployment
from .flwr_cli import FlowerRunError, format_run_config
from .security import TlsFiles
from .simulation import run_simulation

__all__ = ["check_overrides", "main"]


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m fedorasflwr.launch",
        description="Run the Flower app on the simulation engine (default) or on a "
        "local deployment (SuperLink + SuperNodes), then stop every Flower process.",
    )
    parser.add_argument("--app-dir", type=Path, default=Path("."), help="default: .")
    parser.add_argument("--num-supernodes", type=int, default=20, help="default: 20")
    parser.add_argument("--run-config", default=None, help='overrides, e.g. "k=1 s=\\"x\\""')
    parser.add_argument("--deployment", action="store_true", help="use the deployment engine")
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
        "runs in the SuperLink's working directory) unless --run-config sets output-dir",
    )
    parser.add_argument("--flwr-home", type=Path, default=None, help="default: a temp dir")
    parser.add_argument("--timeout", type=float, default=None, help="seconds")
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show everything: Flower's DEBUG lines (Ray backend set-up), its FedAvg "
        "banner per training job and its per-round blocks",
    )
    _add_security_args(parser)
    args = parser.parse_args(argv)
    _check_security_args(parser, args)
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


def check_overrides(run_config: str) -> str | None:
    """Why the ``--run-config`` overrides cannot run (bad syntax, an unknown key), or ``None``.

    The keys are read with Flower's own parser and checked against the app's known keys
    (:func:`fedorasflwr.config.check_known_keys`), so a typo is named with the closest
    key before any Flower process starts (Flower would say only "Invalid run configuration").
    """
    from click import ClickException
    from flwr.common.config import parse_config_args

    from ..config import check_known_keys

    try:
        overrides = parse_config_args([run_config])
        check_known_keys(overrides)
    except ClickException as error:
        return error.format_message()
    except ValueError as error:
        return str(error)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; returns the process exit code."""
    args = _parse_args(argv)
    run_config = args.run_config or ""
    problem = check_overrides(run_config)
    if problem is not None:
        print(f"error: --run-config: {problem}", file=sys.stderr)
        return 2
    if "output-dir=" not in run_config:  # one key may not appear twice in a run config
        output = format_run_config({"output-dir": str(args.output_dir.resolve())})
        run_config = f"{output} {run_config}".strip()
    env = launcher_env(args.verbose)
    echo = ProgressEcho()
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
            ) as dep:
                result = dep.run(args.app_dir, run_config, args.timeout, echo=echo)  # type: ignore[arg-type]
        else:
            result = run_simulation(
                args.app_dir,
                num_supernodes=args.num_supernodes,
                run_config=run_config,
                flwr_home=args.flwr_home,
                client_num_cpus=args.client_num_cpus,
                timeout=args.timeout,
                echo=echo,
                env=env,
                federation_config={"verbose": True} if args.verbose else None,
            )
    except FlowerRunError as error:
        echo.close()
        print(f"\nFAILED: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        echo.close()
        print("\ninterrupted; Flower processes stopped", file=sys.stderr)
        return 130
    echo.close()
    print(f"\nrun {result.run_id} {result.status} in {result.wall_time:.1f}s")
    return 0
