"""`fedorasflwr.backoff.HeldBackoff`: the waits by hand on a virtual clock."""

from __future__ import annotations

import functools
import math
import time

import pytest

from fedorasflwr.backoff import (
    OBJECT_PULL_FIRST_WAIT,
    OBJECT_PULL_LONGEST_WAIT,
    PROMPT_MARK,
    HeldBackoff,
    prompt_object_pulls,
)


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


def test_prompt_object_pulls_retry_a_missing_object_after_a_twentieth_of_a_second():
    """Flower's own pull of a message's objects, retrying an object its peer does not hold
    yet: after 0.05 s, 0.1 s, ... instead of 1 s, 2 s, ...; no count of tries, Flower's time
    limit kept."""
    from flwr.supercore.inflatable import inflatable_utils as flower

    tries: list[float] = []

    def pull_object(object_id: str) -> bytes:
        tries.append(time.monotonic())
        if len(tries) < 3:  # on its way for the first two tries
            raise flower.ObjectUnavailableError(object_id)
        return b"content"

    pull = prompt_object_pulls(flower.pull_objects)
    assert isinstance(pull, functools.partial) and getattr(pull, PROMPT_MARK)
    assert pull.keywords == {
        "initial_backoff": OBJECT_PULL_FIRST_WAIT,
        "backoff_cap": OBJECT_PULL_LONGEST_WAIT,
        "max_tries_per_object": None,
    }
    assert pull(["a"], pull_object_fn=pull_object) == {"a": b"content"}
    first, second = tries[1] - tries[0], tries[2] - tries[1]
    # 0.05 and 0.1 s, +-20% jitter (Flower's: 1 and 2 s); the upper bounds leave room for a
    # loaded machine and stay far below Flower's 0.8 s
    assert 0.8 * OBJECT_PULL_FIRST_WAIT <= first < 0.6
    assert 1.6 * OBJECT_PULL_FIRST_WAIT <= second < 0.7
