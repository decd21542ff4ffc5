"""The nonce that binds a reply to the instruction it answers (docs/protocol.md).

The server puts a ``ConfigRecord`` ``nonce`` in every instruction: the step's ``stage``
and ``step`` (round, iteration ...) and a random ``tag`` (``secrets``, not the run's
seeded streams: it changes no result).  The ClientApp copies it unchanged into its
reply (``echo``, called for every handler by ``fedorasflwr.clients.register``; the mod
``echo_nonce`` for a ClientApp of your own).  The server keeps only a reply that echoes
the nonce of the instruction sent to that node in that step
(``federation.replies.screen_replies``): a reply to an earlier round's message no longer
fits the current one because its keys happen to match.  A client can still put old
content under the current nonce; that is no binding's job (docs/protocol.md).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from typing import Any

from flwr.app import ConfigRecord, Context, Message, RecordDict

from .protocol import NONCE

__all__ = ["describe", "echo", "echo_nonce", "nonce_of", "stamp"]


def stamp(message: Message, stage: str, step: int) -> Message:
    """Give ``message`` a fresh nonce of ``stage`` and ``step`` (a message that already
    carries one keeps it).  The content becomes a new ``RecordDict`` holding the same
    records: Flower's FedAvg sends one ``RecordDict`` object to every node."""
    if nonce_of(message) is None:
        nonce = ConfigRecord({"stage": stage, "step": int(step), "tag": secrets.token_hex(8)})
        message.content = RecordDict({**dict(message.content.items()), NONCE: nonce})
    return message


def nonce_of(message: Message) -> dict[str, Any] | None:
    """The nonce ``message`` carries (``None``: none, or an error reply)."""
    if not message.has_content():
        return None
    record = message.content.config_records.get(NONCE)
    return None if record is None else dict(record)


def describe(nonce: Mapping[str, Any] | None) -> str:
    """e.g. ``"stage supernet, step 3"`` (the tag is not shown; a client's values are cut
    to 40 characters: they go into logs and error messages)."""
    if nonce is None:
        return "no nonce"
    return f"stage {str(nonce.get('stage'))[:40]}, step {str(nonce.get('step'))[:40]}"


def echo(instruction: Message, reply: Message) -> Message:
    """``reply`` carrying the nonce of ``instruction`` (unchanged when either has none:
    an error reply, an instruction of another server)."""
    nonce = nonce_of(instruction)
    if nonce is not None and reply.has_content():
        reply.content[NONCE] = ConfigRecord(nonce)
    return reply


def echo_nonce(msg: Message, context: Context, call_next: Callable[..., Message]) -> Message:
    """ClientApp mod: the reply echoes the instruction's nonce (for a ClientApp of your
    own that answers this library's strategies: ``ClientApp(mods=[echo_nonce])``)."""
    return echo(msg, call_next(msg, context))
