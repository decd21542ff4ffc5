"""A Grid that collects replies as soon as they arrive.

Flower's ``HttpGrid`` (the ServerApp's grid on the deployment engine, Flower 1.41; the
simulation engine's ServerApp uses an in-memory grid pulling every 0.1 s) pulls the
replies of ``send_and_receive`` and, while some are missing, sleeps 3 s before it pulls
again: every step whose replies are not there at the first pull waits for the next
multiple of 3 s (a tiny FedorAS deployment round: 22.4 s with it, 20.2 s with this
module; ``python benchmarks/engines.py --configs tiny``). ``PromptGrid`` wraps any grid
and polls at a short interval that grows while nothing arrives (``first`` s, x1.5 per
empty pull, at most ``held`` s for ``hold`` s after the push or a reply, then at most
``longest`` s; `fedorasflwr.backoff.HeldBackoff`), so a step ends soon after its last
reply while a long one costs the SuperLink about one pull a second. Everything else is the wrapped
grid's, except that ``prompt`` also has Flower's ``HttpGrid`` retry a reply's object that
is not on the SuperLink yet after 0.05 s instead of 1 s
(`fedorasflwr.backoff.prompt_object_pulls`). Every strategy here wraps the grid it is
started on (``prompt``), so a library user's ServerApp gets this too.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Iterable

from flwr.app import Message
from flwr.serverapp import Grid

from ..backoff import PROMPT_MARK, HeldBackoff, prompt_object_pulls

__all__ = ["POLLING_ENV", "PromptGrid", "WrappedGrid", "prompt"]

#: where Flower 1.41 defines ``HttpGrid``, the deployment ServerApp's grid
HTTP_GRID_MODULE = "flwr.superlink.grid.http_grid"

#: ``FEDORASFLWR_GRID_POLLING=flower`` in the ServerApp's environment keeps Flower's own
#: polling (``benchmarks/engines.py`` compares the two side by side)
POLLING_ENV = "FEDORASFLWR_GRID_POLLING"
#: with it set, each ``PromptGrid.send_and_receive`` appends a line to that file (a file
#: of its own: the ClientApp's ``$FEDORASFLWR_TIMING_LOG`` holds one line per message and
#: nothing else; ``benchmarks/engines.py`` reads both)
GRID_TIMING_LOG_ENV = "FEDORASFLWR_GRID_TIMING_LOG"


class WrappedGrid(Grid):
    """A ``Grid`` that hands everything to the ``grid`` it wraps (a subclass overrides
    what it changes: ``PromptGrid`` the polling, ``wire.PackingGrid`` the packing)."""

    def __init__(self, grid: Grid) -> None:
        self.grid = grid

    def set_run(self, run) -> None:  # type: ignore[no-untyped-def]  # flwr's Run
        self.grid.set_run(run)

    @property
    def run(self):  # type: ignore[no-untyped-def]  # flwr's Run
        return self.grid.run

    def create_message(self, *args, **kwargs) -> Message:  # type: ignore[no-untyped-def]
        return self.grid.create_message(*args, **kwargs)

    def get_node_ids(self) -> Iterable[int]:
        return self.grid.get_node_ids()

    def get_nodes(self):  # type: ignore[no-untyped-def]  # Iterable[NodeInfo]
        return self.grid.get_nodes()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.grid.pull_messages(message_ids)

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        return self.grid.send_and_receive(messages, timeout=timeout)


class PromptGrid(WrappedGrid):
    """``grid`` with ``send_and_receive`` polling every ``first`` .. ``longest`` seconds."""

    def __init__(
        self,
        grid: Grid,
        *,
        first: float = 0.05,
        longest: float = 1.0,
        held: float = 0.25,
        hold: float = 10.0,
    ) -> None:
        if not 0 < first <= longest:
            raise ValueError(f"need 0 < first <= longest, got {first!r}, {longest!r}")
        super().__init__(grid)
        self.first = first
        self.longest = longest
        # at most `held` s between pulls for `hold` s after the push or a reply
        self.held = min(max(held, first), longest)
        self.hold = hold

    # --- prompt collection ------------------------------------------------------------

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        """As ``Grid.send_and_receive``: push ``messages``, then pull their replies until
        every one has arrived or ``timeout`` seconds have passed (``None``: no limit)."""
        messages = list(messages)
        sent = time.time()
        waiting = set(self.push_messages(messages))
        pushed = time.time()
        end = None if timeout is None else time.monotonic() + timeout
        replies: list[Message] = []
        arrivals: list[float] = []
        backoff = HeldBackoff(
            self.first, 1.5, self.held, self.longest, self.hold, clock=time.monotonic
        )
        while waiting:
            arrived = list(self.pull_messages(waiting))
            replies.extend(arrived)
            arrivals.extend(time.time() for _ in arrived)
            waiting.difference_update(m.metadata.reply_to_message_id for m in arrived)
            if not waiting:
                break
            if arrived:
                backoff.activity()
            left = math.inf if end is None else end - time.monotonic()
            if left <= 0:
                break
            time.sleep(backoff.next_wait(at_most=left))
        if path := os.environ.get(GRID_TIMING_LOG_ENV):
            _log_step(path, messages, sent, pushed, arrivals)
        return replies


def _log_step(
    path: str, messages: list[Message], sent: float, pushed: float, arrivals: list[float]
) -> None:
    """One line of the grid's timing log for a ``send_and_receive`` step: when it began pushing,
    when the push returned, when each reply was pulled and when it returned (epoch
    seconds); its messages' type and group (Flower's strategies: the server round)."""
    first = messages[0].metadata if messages else None
    record = {
        "role": "grid",
        "pid": os.getpid(),
        "message-type": first.message_type if first else None,
        "group-id": first.group_id if first else None,
        "messages": len(messages),
        "sent": sent,
        "pushed": pushed,
        "arrivals": arrivals,
        "returned": time.time(),
    }
    with open(path, "a", encoding="utf-8") as sink:
        sink.write(json.dumps(record) + "\n")


def prompt(grid: Grid) -> Grid:
    """Flower's ``HttpGrid`` wrapped in a :class:`PromptGrid` (and its module's pull of a
    reply's objects retrying a missing one after 0.05 s, for the whole process); any other
    grid as it is (a wrapped one, the in-process grid of the tests, a user's grid with its
    own timing), or when ``$FEDORASFLWR_GRID_POLLING`` is ``flower``."""
    if os.environ.get(POLLING_ENV, "") == "flower":
        return grid
    # An HttpGrid exists only once its module is imported; importing it here (fastapi,
    # httpx) cost every process that never meets one 1.3 s: `python -X importtime -c
    # "import fedorasflwr.server_app"` took 4.9 s with it, 3.6 s without
    http_grid = sys.modules.get(HTTP_GRID_MODULE)
    if http_grid is not None and isinstance(grid, http_grid.HttpGrid):
        # its pull of a reply's objects, which may still be on their way to the SuperLink,
        # retried after 0.05 s instead of 1 s (once per process: HttpGrid calls it by the
        # module's name; Flower's own timing with the environment variable above)
        if not getattr(http_grid.pull_objects, PROMPT_MARK, False):
            http_grid.pull_objects = prompt_object_pulls(http_grid.pull_objects)
        return PromptGrid(grid)
    return grid
