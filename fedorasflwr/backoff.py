"""The wait between two polls that find nothing, shared by every poller of a deployment.

A poller (the ServerApp's ``PromptGrid`` waiting for replies, a prompt SuperNode waiting
for its next message, a warm executor waiting for a task) that finds nothing waits
``first`` seconds, then ``growth`` times longer after each further empty poll. For ``hold``
seconds after its last activity (a reply, a message, a task) the waits stop growing at
``held``: in a run the next message usually comes within a round, and a wait near
``longest`` then delayed it by half that on average. After ``hold`` seconds without
activity they grow on to ``longest``, so an idle deployment polls as rarely as before
(``python benchmarks/idle_cpu.py``). Flower's own pulls of a message's objects retry a
missing one after 1 s, doubling: `prompt_object_pulls` starts them at 0.05 s.
Dependency-free: the prompt SuperNode loads it before Flower.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from typing import Any

__all__ = [
    "OBJECT_PULL_FIRST_WAIT",
    "OBJECT_PULL_LONGEST_WAIT",
    "PROMPT_MARK",
    "HeldBackoff",
    "prompt_object_pulls",
]

#: Seconds before the first retry of a message object that is not there yet, doubling up to
#: `OBJECT_PULL_LONGEST_WAIT` (Flower 1.41: 1 s up to 10 s). A SuperLink offers a message
#: before the ServerApp has pushed its objects, and a SuperNode offers its task before it
#: has pulled them (``flwr/supernode/start_client_internal.py``, ``_pull_and_store_message``):
#: a warm task asks within milliseconds, and 3 of 12 training messages of the engines
#: benchmark took 1.56-1.66 s from their fork to their app imported instead of 0.33-0.51 s
#: (``python benchmarks/engines.py``; with these waits 0.34-0.61 s, benchmarks/README.md
#: "Object pulls"). The ServerApp's
#: grid pulling a reply's objects, the SuperNode pulling a message's and the task pulling
#: them from its SuperNode each retry so (`fedorasflwr.federation.polling.prompt`,
#: `fedorasflwr.launch.supernode`, `fedorasflwr.launch.warm`).
OBJECT_PULL_FIRST_WAIT = 0.05
#: The longest wait between two tries of a missing object (`OBJECT_PULL_FIRST_WAIT`).
OBJECT_PULL_LONGEST_WAIT = 1.0
#: The attribute `prompt_object_pulls` sets on what it returns
PROMPT_MARK = "_fedorasflwr_prompt"


def prompt_object_pulls(pull: Any) -> Any:
    """Flower's object pull ``pull`` (``pull_objects`` or
    ``pull_and_inflate_object_from_tree``) retrying a missing object after
    `OBJECT_PULL_FIRST_WAIT` s, then up to `OBJECT_PULL_LONGEST_WAIT` s, within Flower's time
    limit (its default ``max_time``, 2 hours) and without its count of tries (500, which at
    1-s waits would end a slow pull after about 8 minutes instead). The result carries
    `PROMPT_MARK` (true), so a caller can tell it from Flower's own."""
    prompt = functools.partial(
        pull,
        initial_backoff=OBJECT_PULL_FIRST_WAIT,
        backoff_cap=OBJECT_PULL_LONGEST_WAIT,
        max_tries_per_object=None,
    )
    setattr(prompt, PROMPT_MARK, True)
    return prompt


class HeldBackoff:
    """Waits between empty polls: ``first`` after activity, growing by ``growth`` up to
    ``held`` while the last activity is under ``hold`` seconds old, then up to ``longest``.

    Parameters
    ----------
    first : float
        Seconds of the first wait after activity (``> 0``).
    growth : float
        Each empty poll's wait over the one before (``>= 1``).
    held : float
        The longest wait within ``hold`` seconds of activity (``first <= held``).
    longest : float
        The longest wait (``held <= longest``; ``math.inf``: only ``next_wait``'s
        ``at_most``).
    hold : float
        Seconds after activity during which waits stay at most ``held`` (``>= 0``; 0: no
        hold). A new poller counts as active from its start.
    clock : callable, default time.monotonic
        Seconds, for the hold (a test passes a fake).
    """

    def __init__(
        self,
        first: float,
        growth: float,
        held: float,
        longest: float,
        hold: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        values = (first, growth, held, hold)
        if not all(math.isfinite(v) for v in values) or math.isnan(longest):
            raise ValueError(
                "HeldBackoff: first, growth, held and hold must be finite and longest a "
                f"number (inf: no limit but the caller's), got {(*values, longest)!r}"
            )
        if not (0 < first <= held <= longest and growth >= 1 and hold >= 0):
            raise ValueError(
                "HeldBackoff: need 0 < first <= held <= longest, growth >= 1 and hold >= 0; "
                f"got first={first!r}, held={held!r}, longest={longest!r}, "
                f"growth={growth!r}, hold={hold!r}"
            )
        self.first, self.growth, self.held = first, growth, held
        self.longest, self.hold = longest, hold
        self._clock = clock
        self._wait = first
        self._active_at = clock()

    def activity(self) -> None:
        """Something came (or went out): waits start again at ``first`` and are held."""
        self._wait = self.first
        self._active_at = self._clock()

    def next_wait(self, at_most: float = math.inf) -> float:
        """The wait before the next poll (at most ``at_most``), after an empty poll; the one
        after it grows."""
        cap = self.held if self._clock() - self._active_at < self.hold else self.longest
        wait = min(self._wait, cap)
        self._wait = min(wait * self.growth, self.longest)
        return min(wait, at_most)
