"""Shared pieces of the reliability suite."""

from __future__ import annotations

from collections.abc import Iterable

from flwr.app import Message

from fedorasflwr.inprocess import InProcessGrid


class TrainingStartedError(AssertionError):
    """Raised by ``NoTrainingGrid`` when a strategy sends its first training instruction."""


class NoTrainingGrid(InProcessGrid):
    """An in-process grid that answers profiling but stops the run at the first
    ``train.*`` message: a config that reaches it was not refused before training."""

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        messages = list(messages)
        if any(m.metadata.message_type.startswith("train.") for m in messages):
            raise TrainingStartedError(messages[0].metadata.message_type)
        return super().send_and_receive(messages, timeout=timeout)
