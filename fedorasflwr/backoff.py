"""The wait between two polls that find nothing, shared by every poller of a deployment.

A poller (the ServerApp's ``PromptGrid`` waiting for replies, a prompt SuperNode waiting
for its next message, a warm executor waiting for a task) that finds nothing waits
``first`` seconds, then ``growth`` times longer after each further empty poll. For ``hold``
seconds after its last activity (a reply, a message, a task) the waits stop growing at
``held``: in a run the next message usually comes within a round, and a wait near
``longest`` then delayed it by half that on average. After ``hold`` seconds without
activity they grow on to ``longest``, so an idle deployment polls as rarely as before
(``python benchmarks/idle_cpu.py``). Dependency-free: the prompt SuperNode loads it before
Flower.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

__all__ = ["HeldBackoff"]


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
