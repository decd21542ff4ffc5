"""``python -m fedorasflwr.launch.supernode [flower-supernode arguments]``: Flower's
``flower-supernode``, pulling a round's messages promptly.

Flower 1.41's SuperNode loop (``flwr/supernode/start_client_internal.py``) sleeps 3 s
whenever a pull from the SuperLink finds no message, and checks every 0.5 s whether its
ClientApp's reply is ready. Between two rounds a node always finds nothing at first (the
ServerApp is still aggregating), so each message waited 0-3 s on its node before it was
pulled, and a round waits for its slowest node.

Here the wait after a pull that found nothing starts at `FIRST_IDLE_WAIT` once a reply has
gone out and grows by `IDLE_GROWTH` per empty pull, at most `HELD_IDLE_WAIT` for
`ACTIVE_HOLD` seconds after the reply (the next round's message usually comes within
that), then up to Flower's own wait, so an idle node polls as Flower's does
(`fedorasflwr.backoff.HeldBackoff`); the reply check runs every `REPLY_CHECK` seconds (it
reads the node's own state, no request), and a message's object that the SuperLink does not
hold yet is asked for again after 0.05 s instead of Flower's 1 s
(`fedorasflwr.backoff.prompt_object_pulls`). Everything else is Flower's: the loop, its
connection, auth and retries. ``$FEDORASFLWR_SUPERNODE_POLLING=flower`` keeps Flower's timing
(``benchmarks/engines.py`` can compare the two). A module of its own, which the package does
not import, so that ``-m`` runs it once. The Flower internals it changes are looked up
at start; if a Flower release moved them it exits 1 naming them and the installed Flower
(`fedorasflwr.launch.warm_compat`).
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any

from ..backoff import HeldBackoff, prompt_object_pulls
from .warm_compat import (
    FlowerInternal,
    FlowerInternalsError,
    load_flower_internals,
)

__all__ = [
    "ACTIVE_HOLD",
    "FIRST_IDLE_WAIT",
    "HELD_IDLE_WAIT",
    "IDLE_GROWTH",
    "POLLING_ENV",
    "REPLY_CHECK",
    "SUPERNODE_INTERNALS",
    "PromptClock",
    "main",
    "make_prompt",
]

#: ``flower`` keeps Flower's own timing in the SuperNode
POLLING_ENV = "FEDORASFLWR_SUPERNODE_POLLING"
#: seconds before the first pull after a reply went out (the next round's message is usually
#: not there yet: the ServerApp aggregates first)
FIRST_IDLE_WAIT = 0.1
#: each pull that finds nothing makes the next wait this much longer, up to Flower's own
#: (the ServerApp's `fedorasflwr.federation.polling.PromptGrid` grows its own waits alike)
IDLE_GROWTH = 1.5
#: the longest idle wait for `ACTIVE_HOLD` seconds after a reply went out: in a run the
#: next round's message usually comes within a round, and a node whose wait had grown to
#: 3 s pulled it 1.5 s late on average (a pull is one small request to the SuperLink)
HELD_IDLE_WAIT = 0.25
#: seconds after a reply during which idle waits stay at most `HELD_IDLE_WAIT`
ACTIVE_HOLD = 30.0
#: seconds between the checks for the ClientApp's reply (Flower's: 0.5)
REPLY_CHECK = 0.1
#: Flower's waits from this length on are the idle wait after an empty pull (Flower 1.41:
#: 3 s); shorter ones wait for a reply or an object in the node's own store (0.5 s)
_IDLE_FROM = 1.0

#: what this module changes in Flower's SuperNode, and the entry point it then runs
SUPERNODE_INTERNALS: tuple[FlowerInternal, ...] = (
    FlowerInternal("flwr.supernode.start_client_internal", "time"),
    FlowerInternal("flwr.supernode.start_client_internal", "_push_messages"),
    FlowerInternal(
        "flwr.supernode.start_client_internal",
        "pull_objects",
        ("initial_backoff", "backoff_cap", "max_tries_per_object"),
    ),
    FlowerInternal("flwr.supernode.cli", "flower_supernode"),
)


class PromptClock:
    """Stands in for the ``time`` module inside Flower's SuperNode loop: ``sleep`` shortens
    Flower's waits as the module docstring says; every other attribute is ``clock``'s.

    Parameters
    ----------
    clock : module, default time
        The real clock (a test passes a fake one with ``sleep``).
    """

    def __init__(self, clock: Any = time) -> None:
        self._clock = clock
        # Flower's idle wait (3 s) bounds every wait through `sleep`'s `seconds`
        self.backoff = HeldBackoff(
            FIRST_IDLE_WAIT,
            IDLE_GROWTH,
            HELD_IDLE_WAIT,
            math.inf,
            ACTIVE_HOLD,
            clock=clock.monotonic,
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._clock, name)

    def sleep(self, seconds: float) -> None:
        """Flower's ``time.sleep(seconds)``, shortened: an idle wait (``seconds`` >= 1) is
        the current back-off (at most ``seconds``), which then grows; a shorter one is at
        most `REPLY_CHECK`."""
        if seconds >= _IDLE_FROM:
            wait = self.backoff.next_wait(at_most=seconds)
        else:
            wait = min(seconds, REPLY_CHECK)
        self._clock.sleep(wait)

    def message_handled(self) -> None:
        """A message was pulled and its reply pushed: the next round's may come soon."""
        self.backoff.activity()


def make_prompt(module: Any, clock: PromptClock) -> None:
    """Point ``module`` (Flower's ``start_client_internal``) at ``clock`` for its waits,
    have its ``_push_messages`` reset the back-off after each reply it pushes, and its
    ``pull_objects`` retry a message's missing object sooner than Flower's 1 s
    (`fedorasflwr.backoff.prompt_object_pulls`)."""
    push = module._push_messages

    def push_then_reset(*args: Any, **kwargs: Any) -> None:
        try:
            push(*args, **kwargs)
        finally:
            clock.message_handled()

    push_then_reset.__wrapped__ = push  # type: ignore[attr-defined]
    module._push_messages = push_then_reset
    module.pull_objects = prompt_object_pulls(module.pull_objects)
    module.time = clock


def main() -> None:
    """Make Flower's SuperNode loop prompt (unless ``$FEDORASFLWR_SUPERNODE_POLLING`` is
    ``flower``), then run ``flower-supernode`` with this process's arguments."""
    try:
        found = load_flower_internals(
            SUPERNODE_INTERNALS,
            who="the prompt SuperNode",
            instead="start Flower's own flower-supernode (Deployment(prompt_supernodes=False))",
        )
    except FlowerInternalsError as error:
        sys.exit(f"fedorasflwr.launch.supernode: {error}")
    if os.environ.get(POLLING_ENV, "") != "flower":
        make_prompt(sys.modules["flwr.supernode.start_client_internal"], PromptClock())
    sys.argv[0] = "flower-supernode"  # Flower names its process by it
    sys.exit(found["flower_supernode"]())


if __name__ == "__main__":
    main()
