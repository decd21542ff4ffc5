"""`fedorasflwr.backoff.HeldBackoff`: the waits by hand on a virtual clock."""

from __future__ import annotations

import math

import pytest

from fedorasflwr.backoff import HeldBackoff


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_waits_are_held_after_activity_then_grow_to_the_longest():
    clock = Clock()
    backoff = HeldBackoff(0.1, 2.0, 0.3, 1.0, hold=5.0, clock=clock)
    # a new poller counts as active: 0.1, 0.2, then held at 0.3
    assert [backoff.next_wait() for _ in range(4)] == pytest.approx([0.1, 0.2, 0.3, 0.3])
    clock.now = 4.99
    assert backoff.next_wait() == pytest.approx(0.3)
    clock.now = 5.0  # the hold is over: doubling from the held wait, up to the longest
    assert [backoff.next_wait() for _ in range(3)] == pytest.approx([0.6, 1.0, 1.0])
    backoff.activity()
    assert backoff.next_wait() == pytest.approx(0.1)
    assert backoff.next_wait(at_most=0.05) == pytest.approx(0.05)  # the caller's bound
    assert backoff.next_wait() == pytest.approx(0.3)  # growth went on from 0.2 all the same


def test_no_hold_grows_at_once_and_an_unbounded_longest_leaves_the_bound_to_the_caller():
    clock = Clock()
    plain = HeldBackoff(0.1, 1.5, 0.1, 1.0, hold=0.0, clock=clock)
    assert [plain.next_wait() for _ in range(3)] == pytest.approx([0.1, 0.15, 0.225])
    clock.now = 100.0
    open_ended = HeldBackoff(0.1, 10.0, 0.1, math.inf, hold=1.0, clock=clock)
    clock.now = 101.0
    assert [open_ended.next_wait(at_most=3.0) for _ in range(4)] == [0.1, 1.0, 3.0, 3.0]


@pytest.mark.parametrize(
    ("first", "growth", "held", "longest", "hold"),
    [
        (0.0, 2.0, 0.3, 1.0, 5.0),  # no first wait
        (0.5, 2.0, 0.3, 1.0, 5.0),  # held below first
        (0.1, 2.0, 2.0, 1.0, 5.0),  # held above longest
        (0.1, 0.5, 0.3, 1.0, 5.0),  # shrinking
        (0.1, 2.0, 0.3, 1.0, -1.0),  # negative hold
        (0.1, 2.0, 0.3, math.nan, 5.0),
        (0.1, 2.0, math.inf, math.inf, 5.0),
    ],
)
def test_bad_values_are_refused_with_their_names(first, growth, held, longest, hold):
    with pytest.raises(ValueError, match="HeldBackoff: .*first"):
        HeldBackoff(first, growth, held, longest, hold)
