"""The launcher's up-front check of a run's values: the ServerApp's own parser and data
checks, run before any Flower process starts (a bad value then fails at once, exit 2,
instead of minutes later inside the engine)."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path

from .flwr_cli import ConfigValue

__all__ = ["SERVER_APP", "AppDirError", "check_run_values"]


class AppDirError(ValueError):
    """``--app-dir`` is not a Flower app's directory (no readable ``pyproject.toml`` with a
    ``[tool.flwr.app]`` table)."""


#: the ServerApp whose run-config parser `check_run_values` runs (another app, e.g. one of
#: ``examples/``, checks its own keys when its run starts)
SERVER_APP = "fedorasflwr.server_app:app"


def check_run_values(
    app_dir: Path, values: Mapping[str, ConfigValue], num_partitions: int
) -> dict[str, ConfigValue]:
    """Run the ServerApp's whole check of the run config before any Flower process starts.

    The app's ``[tool.flwr.app.config]`` with `values` over it, as Flower hands it to the
    ServerApp, goes through :func:`fedorasflwr.config.parse_run_config` (every method's
    settings: ranges, types, cross-key rules), then the data checks the ServerApp makes
    before any training: the dataset's shape and classes (`fedorasflwr.data.dataset_info`;
    a ``folder:`` dataset is inspected: `fedorasflwr.data.folder`) and whether
    `num_partitions` clients can all get data. A relative ``folder:<path>`` is made
    absolute against this directory first (the engine runs in another one).

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

    values = absolute_folder(values, Path.cwd())
    pyproject = Path(app_dir) / "pyproject.toml"
    try:
        app = tomllib.loads(pyproject.read_text())["tool"]["flwr"]["app"]
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise AppDirError(f"--app-dir {str(app_dir)!r}: cannot read {pyproject}: {error}") from None
    except (KeyError, TypeError):
        raise AppDirError(
            f"--app-dir {str(app_dir)!r}: {pyproject} has no [tool.flwr.app]"
        ) from None
    if app.get("components", {}).get("serverapp") != SERVER_APP:
        return values
    settings = parse_run_config({**flatten_dict(app.get("config", {})), **values})
    dataset_info(settings.data)
    settings.data.check_partitionable(num_partitions)
    return values
