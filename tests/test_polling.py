"""PromptGrid collects replies as they arrive (on a virtual clock: no wall-clock asserts)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable
from types import SimpleNamespace

import pytest
from flwr.app import Message
from flwr.serverapp import Grid

import fedorasflwr.federation.polling as polling
from fedorasflwr.federation.polling import PromptGrid, prompt
from fedorasflwr.inprocess import InProcessGrid


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class SlowNodes(Grid):
    """Replies to message ``i`` become available at virtual time ``ready[i]``."""

    def __init__(self, clock: Clock, ready: list[float]) -> None:
        self.clock = clock
        self.ready = ready
        self.pulls = 0
        self.replies: dict[str, Message] = {}

    def set_run(self, run):  # pragma: no cover - not used
        raise NotImplementedError

    @property
    def run(self):  # pragma: no cover - not used
        raise NotImplementedError

    def create_message(self, *args, **kwargs):  # pragma: no cover - not used
        raise NotImplementedError

    def get_node_ids(self) -> Iterable[int]:
        return range(len(self.ready))

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = [f"m{i}" for i, _ in enumerate(messages)]
        for message_id in ids:  # a reply as PromptGrid reads it
            self.replies[message_id] = SimpleNamespace(
                metadata=SimpleNamespace(reply_to_message_id=message_id)
            )
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        self.pulls += 1
        return [
            self.replies.pop(i)
            for i in sorted(message_ids)
            if i in self.replies and self.ready[int(i[1:])] <= self.clock.now
        ]

    def send_and_receive(self, messages, *, timeout=None):  # pragma: no cover - not used
        raise NotImplementedError


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(polling.time, "monotonic", fake.monotonic)
    monkeypatch.setattr(polling.time, "sleep", fake.sleep)
    return fake


def messages(count: int) -> list[Message]:
    """Stand-ins: PromptGrid hands the messages to ``push_messages`` untouched."""
    return [SimpleNamespace(index=i) for i in range(count)]  # type: ignore[misc]


def test_a_step_ends_soon_after_its_last_reply_not_on_a_three_second_beat(clock):
    nodes = SlowNodes(clock, ready=[0.0, 1.2, 4.0])
    replies = PromptGrid(nodes, first=0.05, longest=1.0).send_and_receive(messages(3))
    assert sorted(m.metadata.reply_to_message_id for m in replies) == ["m0", "m1", "m2"]
    assert 4.0 <= clock.now <= 5.0  # Flower's grid: 6.0, the next multiple of 3 s
    assert max(clock.sleeps) <= 1.0 and clock.sleeps[0] == 0.05
    assert nodes.pulls <= 20  # about one pull a second once nothing arrives


def test_the_timeout_returns_what_arrived(clock):
    nodes = SlowNodes(clock, ready=[0.5, 100.0])
    replies = PromptGrid(nodes).send_and_receive(messages(2), timeout=10.0)
    assert [m.metadata.reply_to_message_id for m in replies] == ["m0"]
    assert clock.now == pytest.approx(10.0)


def test_only_flowers_http_grid_is_wrapped(monkeypatch):
    from flwr.superlink.grid.http_grid import HttpGrid

    http = HttpGrid.__new__(HttpGrid)  # no connection needed to check the wrapping
    wrapped = prompt(http)
    assert isinstance(wrapped, PromptGrid) and wrapped.grid is http
    assert prompt(wrapped) is wrapped
    grid = InProcessGrid(lambda *_: None, {}, 1)  # type: ignore[arg-type]
    assert prompt(grid) is grid
    monkeypatch.setenv(polling.POLLING_ENV, "flower")
    assert prompt(http) is http
    with pytest.raises(ValueError, match="need 0 < first <= longest"):
        PromptGrid(http, first=2.0, longest=1.0)


def test_the_server_app_does_not_import_flowers_http_grid():
    # a simulation's or an in-process ServerApp never meets an HttpGrid: importing its module
    # (fastapi, httpx) would cost each of those processes about 1.3 s of imports for nothing
    code = f"import sys, fedorasflwr.server_app; print({polling.HTTP_GRID_MODULE!r} in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
