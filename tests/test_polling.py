"""PromptGrid collects replies as they arrive (on a virtual clock: no wall-clock asserts)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable
from types import SimpleNamespace

import pytest
from flwr.app import Message
from flwr.serverapp import Grid

import fedorasflwr.federation.polling as polling
from fedorasflwr.backoff import OBJECT_PULL_FIRST_WAIT
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
    assert 4.0 <= clock.now <= 4.25  # Flower's grid: 6.0, the next multiple of 3 s
    # held at most 0.25 s apart within 10 s of the push or a reply
    assert max(clock.sleeps) <= 0.25 and clock.sleeps[0] == 0.05


def test_a_long_step_costs_about_one_pull_a_second_after_the_hold(clock):
    nodes = SlowNodes(clock, ready=[0.0, 100.0])
    PromptGrid(nodes, first=0.05, longest=1.0, held=0.25, hold=10.0).send_and_receive(messages(2))
    assert 100.0 <= clock.now <= 101.0
    held = [s for s, at in zip(clock.sleeps, _stamps(clock.sleeps), strict=True) if at < 10.0]
    assert max(held) == 0.25
    assert max(clock.sleeps) == 1.0
    assert nodes.pulls <= 45 + 95  # about 4 a second for 10 s, then about 1 a second


def _stamps(sleeps: list[float]) -> list[float]:
    """The virtual time at which each sleep began."""
    stamps, now = [], 0.0
    for seconds in sleeps:
        stamps.append(now)
        now += seconds
    return stamps


def test_the_timeout_returns_what_arrived(clock):
    nodes = SlowNodes(clock, ready=[0.5, 100.0])
    replies = PromptGrid(nodes).send_and_receive(messages(2), timeout=10.0)
    assert [m.metadata.reply_to_message_id for m in replies] == ["m0"]
    assert clock.now == pytest.approx(10.0)


def test_a_step_logs_when_it_sent_pushed_pulled_each_reply_and_returned(
    clock, monkeypatch, tmp_path
):
    """With the grid's timing log set, one line per step (in a file of its own: the
    ClientApp's log keeps one line per message), which ``benchmarks/engines.py`` splits a
    deployment's time between rounds with."""
    log = tmp_path / "grid-timing.jsonl"
    monkeypatch.setenv("FEDORASFLWR_TIMING_LOG", str(tmp_path / "clientapp-timing.jsonl"))
    monkeypatch.setenv(polling.GRID_TIMING_LOG_ENV, str(log))
    monkeypatch.setattr(polling.time, "time", clock.monotonic)
    nodes = SlowNodes(clock, ready=[0.0, 1.2])
    meta = SimpleNamespace(message_type="train.fedoras_supernet", group_id="3")
    sent = [SimpleNamespace(metadata=meta), SimpleNamespace(metadata=meta)]
    PromptGrid(nodes, first=0.05, longest=1.0).send_and_receive(sent)  # type: ignore[arg-type]
    (line,) = log.read_text().splitlines()
    record = json.loads(line)
    assert record["role"] == "grid" and record["messages"] == 2
    assert (record["message-type"], record["group-id"]) == ("train.fedoras_supernet", "3")
    assert record["sent"] == record["pushed"] == 0.0  # the fake push takes no time
    first, second = record["arrivals"]
    assert first == 0.0 and 1.2 <= second <= 2.2  # pulled within a pause of being ready
    assert record["returned"] == second
    monkeypatch.delenv(polling.GRID_TIMING_LOG_ENV)
    PromptGrid(nodes).send_and_receive(sent)  # type: ignore[arg-type]
    assert len(log.read_text().splitlines()) == 1  # nothing logged without it
    assert not (tmp_path / "clientapp-timing.jsonl").exists()  # nor in the ClientApp's


def test_only_flowers_http_grid_is_wrapped(monkeypatch):
    from flwr.superlink.grid import http_grid
    from flwr.superlink.grid.http_grid import HttpGrid

    flowers_pull = http_grid.pull_objects
    monkeypatch.setattr(http_grid, "pull_objects", flowers_pull)  # restored afterwards
    http = HttpGrid.__new__(HttpGrid)  # no connection needed to check the wrapping
    wrapped = prompt(http)
    assert isinstance(wrapped, PromptGrid) and wrapped.grid is http
    assert prompt(wrapped) is wrapped
    # a reply's objects still on their way are asked for again after 0.05 s, not 1 s
    assert http_grid.pull_objects.func is flowers_pull
    assert http_grid.pull_objects.keywords["initial_backoff"] == OBJECT_PULL_FIRST_WAIT
    prompt(HttpGrid.__new__(HttpGrid))
    assert http_grid.pull_objects.func is flowers_pull  # once per process, not nested
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
