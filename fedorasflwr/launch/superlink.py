"""``python -m fedorasflwr.launch.superlink [flower-superlink arguments]``: Flower's
``flower-superlink`` with the task heartbeat timeout of ``$FEDORASFLWR_HEARTBEAT_TIMEOUT``
(seconds, at least 60; unset: Flower's 60). See `fedorasflwr.launch.heartbeat`; a module of
its own, which the package does not import, so that ``-m`` runs it once."""

from __future__ import annotations

import os
import sys

from .heartbeat import HEARTBEAT_TIMEOUT_ENV, check_heartbeat_timeout, set_task_heartbeat_timeout


def main() -> None:
    """Set the timeout from the environment, then run ``flower-superlink``."""
    value = os.environ.get(HEARTBEAT_TIMEOUT_ENV, "")
    if value:
        try:
            set_task_heartbeat_timeout(check_heartbeat_timeout(value))
        except ValueError as error:
            sys.exit(f"{HEARTBEAT_TIMEOUT_ENV}: {error}")
    from flwr.superlink.cli import flower_superlink

    sys.argv[0] = "flower-superlink"  # Flower names its process by it
    sys.exit(flower_superlink())


if __name__ == "__main__":
    main()
