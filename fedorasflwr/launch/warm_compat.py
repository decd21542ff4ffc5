"""What the warm ClientApp executor shares with Flower: the internals it takes, looked up in
one place, and ``flower-superexec``'s command line.

The executor (`fedorasflwr.launch.warm`) serves a SuperNode's ClientApp tasks with Flower's
own parts: the Runtime API client and its retries, the interceptors ``flower-superexec``
installs (version, tracing, SuperExec auth), the dispatch span and Flower's
``run_clientapp``. None of them is a public API: a Flower release may move or rename any
of them. `load_flower_internals` imports every one at start, with the keywords the
executor passes, and raises `FlowerInternalsError` naming each one that moved, the
installed Flower and the range this module was written for, before any task is taken.
`superexec_parser` takes ``flower-superexec``'s arguments, so that an operator's command
for it runs the executor too; `refused_option` names the ones that do not apply here.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.metadata
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

__all__ = [
    "FLOWER_INTERNALS",
    "REFUSED_OPTIONS",
    "SUPPORTED_FLOWER",
    "FlowerInternal",
    "FlowerInternalsError",
    "flower_version",
    "flower_version_warning",
    "load_flower_internals",
    "refused_option",
    "superexec_parser",
]

#: The Flower releases these internals were read from: the ``flwr`` range of the
#: project's dependency in pyproject.toml (``tests/test_warm_executor.py`` keeps them equal).
SUPPORTED_FLOWER = ">=1.41,<1.42"


@dataclass(frozen=True)
class FlowerInternal:
    """One name the executor takes from Flower: ``module``, then ``attribute`` (dotted
    for a class member), which must accept each of ``keywords`` (a callable's keyword
    arguments, a protobuf message's fields)."""

    module: str
    attribute: str
    keywords: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """``module.attribute``, as an error names it."""
        return f"{self.module}.{self.attribute}"


#: Everything non-public the executor uses, in the order it uses it; ``load_flower_internals``
#: returns them keyed by ``attribute``.
FLOWER_INTERNALS: tuple[FlowerInternal, ...] = (
    # SuperExec auth, as `flower-superexec --superexec-auth-secret-file` reads and signs it
    FlowerInternal("flwr.supercore.auth", "load_superexec_auth_secret", ("secret_file",)),
    FlowerInternal(
        "flwr.supercore.interceptors",
        "SuperExecAuthHttpInterceptor",
        ("master_secret", "protected_methods"),
    ),
    FlowerInternal("flwr.supercore.superexec.run_superexec", "_SUPEREXEC_AUTH_METHODS"),
    # the Runtime API client and the other interceptors `run_superexec` gives it
    FlowerInternal(
        "flwr.supercore.runtime",
        "RuntimeHttpClient.from_server_address",
        ("server_address", "insecure", "root_certificates", "interceptors", "retry_invoker"),
    ),
    FlowerInternal("flwr.supercore.runtime", "RuntimeHttpClient.AcquireTask"),
    FlowerInternal("flwr.supercore.retry", "make_simple_http_retry_invoker"),
    FlowerInternal(
        "flwr.supercore.interceptors", "RuntimeVersionHttpInterceptor", ("component_name",)
    ),
    FlowerInternal("flwr.supercore.runtime.tracing", "RuntimeTracingInterceptor"),
    FlowerInternal(
        "flwr.supercore.runtime.tracing", "RuntimeTracingInterceptor.take_task_traceparent"
    ),
    # a task: asked for, dispatched inside a span, run
    FlowerInternal("flwr.proto.runtime_pb2", "AcquireTaskRequest", ("supported_task_types",)),
    FlowerInternal("flwr.proto.runtime_pb2", "AcquireTaskResponse", ("task", "token")),
    FlowerInternal("flwr.proto.task_pb2", "Task", ("task_id", "run_id")),
    FlowerInternal("flwr.supercore.constant", "TaskType.CLIENT_APP"),
    FlowerInternal("flwr.supercore.tracing", "trace_span", ("traceparent", "attributes")),
    FlowerInternal("flwr.supercore.tracing", "flush_traces"),
    FlowerInternal(
        "flwr.supernode.runtime.run_clientapp",
        "run_clientapp",
        (
            "runtime_api_address",
            "token",
            "insecure",
            "certificates",
            "parent_pid",
            "runtime_dependency_install",
        ),
    ),
    # what `run_clientapp` pulls the message's objects with (`pull_task_input` calls it by
    # this module-level name); the task calls it with a first retry sooner than Flower's
    FlowerInternal(
        "flwr.supernode.runtime.run_clientapp",
        "pull_and_inflate_object_from_tree",
        ("initial_backoff", "backoff_cap", "max_tries_per_object"),
    ),
    # what `run_clientapp` installs the FAB and loads the ClientApp with (module-level
    # names); a task wraps them to reuse an installed FAB and the app imported by the
    # executor (`fedorasflwr.launch.warm_apps`)
    FlowerInternal(
        "flwr.supernode.runtime.run_clientapp",
        "install_from_fab",
        ("fab_file", "install_dir", "skip_prompt"),
    ),
    FlowerInternal(
        "flwr.supernode.runtime.run_clientapp",
        "get_load_client_app_fn",
        ("default_app_ref", "app_path", "multi_app"),
    ),
    # where Flower installs a FAB: a task's report of another directory is refused
    FlowerInternal("flwr.supercore.utils", "get_flwr_home"),
    FlowerInternal("flwr.common.constant", "APP_DIR"),
    FlowerInternal("flwr.common.constant", "FAB_HASH_TRUNCATION"),
)


class FlowerInternalsError(ImportError):
    """The installed Flower lacks internals the warm executor needs (a release moved them)."""


def flower_version() -> str:
    """The installed Flower's version (``flwr``'s distribution), or ``"unknown"``."""
    try:
        return importlib.metadata.version("flwr")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def flower_version_warning() -> str | None:
    """A warning when the installed Flower is outside `SUPPORTED_FLOWER`, else ``None``:
    its internals may be where they were, but were not tried."""
    installed = flower_version()
    try:
        supported = Version(installed) in SpecifierSet(SUPPORTED_FLOWER)
    except InvalidVersion:
        supported = False
    if supported:
        return None
    return (
        f"the warm ClientApp executor was written for flwr{SUPPORTED_FLOWER}; "
        f"Flower {installed} is installed"
    )


def load_flower_internals(
    internals: Sequence[FlowerInternal] = FLOWER_INTERNALS,
    *,
    who: str = "the warm ClientApp executor",
    instead: str = "run Flower's own flower-superexec next to the SuperNode instead",
) -> dict[str, Any]:
    """Import every one of ``internals``; returns them keyed by ``attribute``. ``who``
    needs them and ``instead`` is what to do without them, as the error says.

    Raises
    ------
    FlowerInternalsError
        Naming each one that is missing or no longer takes its keywords, the installed
        Flower and `SUPPORTED_FLOWER`.
    """
    found: dict[str, Any] = {}
    missing: list[str] = []
    for internal in internals:
        try:
            value = functools.reduce(
                getattr, internal.attribute.split("."), importlib.import_module(internal.module)
            )
        except (ImportError, AttributeError) as error:
            missing.append(f"  {internal.name} ({type(error).__name__}: {error})")
            continue
        refused = [k for k in internal.keywords if not _accepts(value, k)]
        if refused:
            missing.append(f"  {internal.name} (no longer takes {', '.join(refused)})")
            continue
        found[internal.attribute] = value
    if missing:
        raise FlowerInternalsError(
            f"{who} needs Flower internals that Flower "
            f"{flower_version()} does not have (it was written for flwr{SUPPORTED_FLOWER}):\n"
            + "\n".join(missing)
            + f'\nInstall a Flower in that range (pip install "flwr{SUPPORTED_FLOWER}"), or '
            f"{instead}."
        )
    return found


def _accepts(value: Any, keyword: str) -> bool:
    """Whether ``value`` takes ``keyword``: a protobuf message's field, or a parameter
    (or ``**kwargs``) of a callable."""
    descriptor = getattr(value, "DESCRIPTOR", None)
    if descriptor is not None and hasattr(descriptor, "fields_by_name"):
        return keyword in descriptor.fields_by_name
    try:
        parameters = inspect.signature(value).parameters
    except (TypeError, ValueError):  # not introspectable: trusted as it is
        return True
    if keyword in parameters:
        return parameters[keyword].kind is not inspect.Parameter.POSITIONAL_ONLY
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


_OTHER_EXECUTOR = (
    "this process is the executor (one fork per task); for another one (Kubernetes, "
    "Flower's subprocesses) run flower-superexec"
)
#: ``flower-superexec`` options the warm executor refuses rather than ignores, with why.
REFUSED_OPTIONS = {
    "--allow-runtime-dependency-installation": (
        "every task is forked from a process that has imported torch and Flower already "
        "and cannot bring other versions of them: install the app's dependencies on the "
        "node, or run flower-superexec on it"
    ),
    "--health-server-address": (
        "not offered: a gRPC server's threads would run in the process every task is "
        "forked from; watch the process instead (it exits non-zero when it fails)"
    ),
    "--executor": _OTHER_EXECUTOR,
    "--executor-config": _OTHER_EXECUTOR,
}


def superexec_parser(prog: str) -> argparse.ArgumentParser:
    """A parser of ``flower-superexec``'s arguments (Flower 1.41,
    ``flwr/supercore/cli/flower_superexec.py``) as the warm executor takes them: those
    that apply, and the `REFUSED_OPTIONS` (`refused_option` names one given)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Serve a SuperNode's ClientApp tasks (flower-supernode --isolation "
        "process) from one warm process, one fork per task, instead of flower-superexec.",
    )
    version = f"Flower {flower_version()} (written for flwr{SUPPORTED_FLOWER})"
    parser.add_argument("-V", "--version", action="version", version=version)
    address = parser.add_mutually_exclusive_group(required=True)
    address.add_argument(
        "--runtime-api-address", help="the SuperNode's Runtime API, host:port (its --port)"
    )
    address.add_argument(
        "--appio-api-address",
        dest="runtime_api_address",
        help="the same (flower-superexec's former name)",
    )
    tls = parser.add_mutually_exclusive_group(required=True)
    tls.add_argument("--insecure", action="store_true", help="plain HTTP to the Runtime API")
    tls.add_argument(
        "--root-certificates", type=Path, help="CA certificate of the Runtime API's TLS"
    )
    parser.add_argument(
        "--superexec-auth-secret-file",
        help="the SuperNode's --superexec-auth-secret-file: sign each AcquireTask with it "
        "(Flower's SuperExec auth)",
    )
    parser.add_argument(
        "--parent-pid",
        type=int,
        help="exit when this process (the SuperNode) is gone (default: run until SIGTERM)",
    )
    parser.add_argument(
        "--plugin-type",
        choices=["clientapp"],
        help="accepted from flower-superexec's commands (it ignores it too): ClientApp "
        "tasks are the only ones served",
    )
    for option in REFUSED_OPTIONS:
        flag = option == "--allow-runtime-dependency-installation"
        parser.add_argument(
            option,
            dest=_refused_dest(option),
            action="store_true" if flag else "store",
            help=argparse.SUPPRESS,
        )
    return parser


def refused_option(args: argparse.Namespace) -> str | None:
    """``"<option>: <why>"`` for the first of `REFUSED_OPTIONS` given, else ``None``."""
    for option, reason in REFUSED_OPTIONS.items():
        if getattr(args, _refused_dest(option)) not in (None, False):
            return f"{option}: {reason}"
    return None


def _refused_dest(option: str) -> str:
    return "refused_" + option.removeprefix("--").replace("-", "_")
