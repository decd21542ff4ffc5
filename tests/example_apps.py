"""What the tests of the example apps under ``examples/`` share: an app's run config as
Flower hands it over, and its package put on ``sys.path`` as Flower puts it."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def app_run_config(app_dir: Path, **overrides: Any) -> dict[str, Any]:
    """The app's ``[tool.flwr.app.config]``, flattened as Flower does, then overrides."""
    table = tomllib.loads((app_dir / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    flat: dict[str, Any] = {}
    for key, value in table["config"].items():
        if isinstance(value, dict):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    unknown = set(overrides) - set(flat)
    assert not unknown, f"not keys of {app_dir.name}'s run config: {sorted(unknown)}"
    flat.update(overrides)
    return flat


def import_app(app_dir: Path) -> None:
    """Make the app's package importable here as Flower makes it in its apps: the app's
    directory on ``sys.path`` (it is not installed)."""
    if str(app_dir) not in sys.path:
        sys.path.insert(0, str(app_dir))
