"""Packed messages on the server side (``fedorasflwr.packing``, docs/protocol.md).

- ``PackingGrid`` wraps the grid a strategy sends on: each instruction to a node whose
  profile declares that it reads packed messages goes out as a copy with its ``arrays``
  packed (one ``uint8`` array and the ``packing`` index; an instruction without arrays gets
  the ``packing`` record alone, which asks for a packed reply). The strategy's own
  messages are left as they are, plain, and receive the message ids the grid gives the
  copies, so replies are matched to them and screened against them as before.
- ``unpack_replies`` turns the replies back into plain records before anything reads
  them: first a reply larger than its instruction allows is refused (nothing decoded),
  then a packed reply's index is checked against the arrays sent to its node
  (``replies.reply_specs``) before a byte of it is decoded; a refused reply comes back
  with the reason, for the caller to drop and book. A plain reply passes as it is (its
  arrays are decoded, against the same specs, by ``replies.check_reply``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid

from ..decoding import ArraySpec
from ..packing import PackingError, is_packed, pack_content, unpack_content
from .polling import WrappedGrid
from .replies import bound_reply_sizes, instructions_of, reply_specs

__all__ = ["PackingGrid", "packing", "unpack_replies"]

#: node id -> whether that node's ClientApp reads packed messages of ``packing.VERSION``
ReadsPacked = Callable[[int], bool]


class PackingGrid(WrappedGrid):
    """``grid`` sending packed copies of the messages to the nodes ``reads_packed`` names."""

    def __init__(self, grid: Grid, reads_packed: ReadsPacked) -> None:
        super().__init__(grid)
        self.reads_packed = reads_packed

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        messages = list(messages)
        wire = self._on_the_wire(messages)
        replies = list(self.grid.send_and_receive(wire, timeout=timeout))
        _give_ids(messages, wire)
        return replies

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        wire = self._on_the_wire(messages)
        ids = list(self.grid.push_messages(wire))
        _give_ids(messages, wire)
        return ids

    def _on_the_wire(self, messages: list[Message]) -> list[Message]:
        """Each message as it travels: a packed copy, or itself (a node that reads only
        plain records, an error, a message packed already)."""
        cache: dict[int, tuple[ArrayRecord, ConfigRecord]] = {}  # one packing per record
        wire = []
        for message in messages:
            if not message.has_content() or not self.reads_packed(message.metadata.dst_node_id):
                wire.append(message)
                continue
            try:
                content = pack_content(message.content, cache)
            except PackingError:  # an array numpy cannot load (another stype): plain
                content = message.content
            if content is message.content:
                wire.append(message)
                continue
            wire.append(
                Message(
                    content,
                    message.metadata.dst_node_id,
                    message.metadata.message_type,
                    ttl=message.metadata.ttl,
                    group_id=message.metadata.group_id,
                )
            )
        return wire


def _give_ids(messages: list[Message], wire: list[Message]) -> None:
    """The ids the grid gave the copies, on the originals. ``Metadata.message_id`` has no
    setter: Flower's own grids write the private field the same way (flwr 1.41
    ``superlink/grid/inmemory_grid.py`` and ``http_grid.py``), and the packing tests and
    the packed-deployment test fail if a Flower upgrade changes it."""
    for message, sent in zip(messages, wire, strict=True):
        if sent is not message and sent.metadata.message_id:
            message.metadata.__dict__["_message_id"] = sent.metadata.message_id


def packing(grid: Grid, reads_packed: ReadsPacked) -> Grid:
    """``grid`` in a ``PackingGrid`` (one already is: as it is)."""
    return grid if isinstance(grid, PackingGrid) else PackingGrid(grid, reads_packed)


def unpack_replies(
    replies: Iterable[Message],
    sent: Iterable[Message] | None = None,
    specs: Callable[[Message], Mapping[str, ArraySpec] | None] = reply_specs,
) -> tuple[list[Message], list[tuple[int, str]]]:
    """``replies`` with plain records (a packed one unpacked in place; error and plain
    replies as they are), and ``(node id, reason)`` for each refused, left out.

    With ``sent`` (the server's own copies of the messages the replies answer), before
    anything is decoded or copied: a reply larger than its instruction allows
    (``bound_reply_sizes``: the lengths of its bytes, nothing decoded) is refused, and a
    packed reply's index is checked against ``specs`` of its instruction (default
    ``reply_specs``: the arrays sent to that node) by ``packing.unpack``; a reply to no
    message sent is left packed, for ``screen_replies`` to refuse. Without ``sent``, a
    packed form is checked for its own consistency only."""
    replies = list(replies)
    refused: list[tuple[int, str]] = []
    instruction_of: Callable[[Message], Message | None] = lambda _: None  # noqa: E731
    if sent is not None:
        sent = list(sent)
        replies, refused = bound_reply_sizes(sent, replies)
        instruction_of = instructions_of(sent)
    kept: list[Message] = []
    for reply in replies:
        if not reply.has_content() or not is_packed(reply.content):
            kept.append(reply)
            continue
        instruction = instruction_of(reply)
        if sent is not None and instruction is None:
            kept.append(reply)
            continue
        expected = specs(instruction) if instruction is not None else None
        try:
            reply.content = unpack_content(reply.content, expected)
        except PackingError as exc:
            refused.append((reply.metadata.src_node_id, f"malformed packed arrays: {exc}"))
            continue
        kept.append(reply)
    return kept, refused
