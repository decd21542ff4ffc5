"""The launcher's up-front check of a run's values: the ServerApp's own parser and data
checks, run before any Flower process starts (a bad value then fails at once, exit 2,
instead of minutes later inside the engine)."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .flwr_cli import ConfigValue

__all__ = ["SERVER_APP", "AppDirError", "app_keys", "check_run_values", "is_ours", "read_app"]


class AppDirError(ValueError):
    """``--app-dir`` is not a Flower app's directory (no readable ``pyproject.toml`` with a
    ``[tool.flwr.app]`` table)."""


#: the ServerApp whose run-config parser `check_run_values` runs (another app, e.g. one of
#: ``examples/``, checks its own keys when its run starts)
SERVER_APP = "fedorasflwr.server_app:app"


def read_app(app_dir: Path) -> dict[str, Any]:
    """The ``[tool.flwr.app]`` table of the Flower app in `app_dir` (its ``pyproject.toml``).

    Raises
    ------
    AppDirError
        The file cannot be read or parsed, or has no ``[tool.flwr.app]`` table.
    """
    pyproject = Path(app_dir) / "pyproject.toml"
    try:
        app = tomllib.loads(pyproject.read_text())["tool"]["flwr"]["app"]
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise AppDirError(f"--app-dir {str(app_dir)!r}: cannot read {pyproject}: {error}") from None
    except (KeyError, TypeError):
        raise AppDirError(
            f"--app-dir {str(app_dir)!r}: {pyproject} has no [tool.flwr.app]"
        ) from None
    if not isinstance(app, dict):
        raise AppDirError(f"--app-dir {str(app_dir)!r}: {pyproject} has no [tool.flwr.app]")
    return app


def is_ours(app: Mapping[str, Any]) -> bool:
    """Whether the app's ServerApp is this package's (`SERVER_APP`), whose run config this
    package parses; any other app (a library user's own) has only its own keys."""
    return app.get("components", {}).get("serverapp") == SERVER_APP


def app_keys(app: Mapping[str, Any]) -> frozenset[str] | None:
    """The run-config keys the app accepts: ``None`` for this package's ServerApp (every key
    its parser reads: `fedorasflwr.config.known_keys`), else the flattened keys of the
    app's own ``[tool.flwr.app.config]`` (what Flower itself accepts as overrides)."""
    from flwr.common.config import flatten_dict

    if is_ours(app):
        return None
    return frozenset(flatten_dict(app.get("config", {})))


def check_run_values(
    app_dir: Path, values: Mapping[str, ConfigValue], num_partitions: int
) -> dict[str, ConfigValue]:
    """Run the ServerApp's whole check of the run config before any Flower process starts.

    For this package's ServerApp (`is_ours`): the app's ``[tool.flwr.app.config]`` with
    `values` over it, as Flower hands it to the ServerApp, goes through
    :func:`fedorasflwr.config.parse_run_config` (every method's settings: ranges, types,
    cross-key rules), then the data checks the ServerApp makes before any training: the
    dataset's shape and classes (`fedorasflwr.data.dataset_info`; a ``folder:`` dataset is
    inspected: `fedorasflwr.data.folder`) and whether `num_partitions` clients can all get
    data. Another app's ServerApp checks its own values when its run starts; here its
    keys were checked against its own table (`app_keys`). A relative ``folder:<path>`` is
    made absolute against this directory first (the engine runs in another one).

    Returns
    -------
    dict
        `values`, with a relative ``folder:<path>`` made absolute.

    Raises
    ------
    ValueError
        Naming the key, the value and what is allowed (the parser's own message).
    """
    from flwr.common.config import flatten_dict

    from ..config import parse_run_config
    from ..data import dataset_info
    from ..data.folder import absolute_folder

    app = read_app(app_dir)
    if not is_ours(app):
        return dict(values)
    values = absolute_folder(values, Path.cwd())
    settings = parse_run_config({**flatten_dict(app.get("config", {})), **values})
    dataset_info(settings.data)
    settings.data.check_partitionable(num_partitions)
    return values
