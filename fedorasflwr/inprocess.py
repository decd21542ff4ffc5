"""An in-process ``Grid``: messages go straight to a ClientApp, no engine.

For debugging a strategy and for measuring what the engines add: the same
strategy and client code run in one process, and faults can be injected (a
client that raises, a malformed reply, a node that never answers).  Nothing
here is used by the ServerApp or ClientApp themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from .packing import is_packed, unpack_content
from .protocol import NONCE

__all__ = ["Fault", "InProcessGrid", "error_reply", "plain_reply", "replace_content"]

#: reply -> altered reply, several replies (a node that sends twice), or None (timed out)
Fault = Callable[[Message], "Message | list[Message] | None"]


class InProcessGrid(Grid):
    """``num_nodes`` nodes with partition ids 0..n-1 and engine-like node ids.

    ``sent`` keeps every message as the grid received it (packed, for a node whose
    ClientApp reads packed messages: ``fedorasflwr.packing.unpack_content`` gives its
    plain records). A fault sees its node's reply as the handler built it (plain
    records) and what it returns travels as it is: plain (accepted as ever) or packed by
    the fault itself (``fedorasflwr.packing.pack_content``), malformed if it likes.
    """

    def __init__(
        self,
        app: ClientApp,
        run_config: Mapping[str, Any],
        num_nodes: int,
        *,
        node_configs: Mapping[int, Mapping[str, Any]] | None = None,
        faults: Mapping[int, Fault] | None = None,
    ) -> None:
        self.app = app
        # Messages take their run and sender from the process's task identity,
        # which an engine sets for the ServerApp process; here we are that process.
        TaskIdentity.run_id = 1
        TaskIdentity.task_id = 0
        TaskIdentity.node_id = SUPERLINK_NODE_ID
        # node ids deliberately not in partition order (engines hand out random ids);
        # distinct for any number of nodes (blocks of 997, shuffled within a block)
        self.node_of_partition = {
            pid: 10_000 + (pid // 997) * 997 + ((pid * 7919) % 997) for pid in range(num_nodes)
        }
        self.contexts = {
            node: Context(
                run_id=1,
                node_id=node,
                node_config={
                    "partition-id": pid,
                    "num-partitions": num_nodes,
                    **dict((node_configs or {}).get(pid, {})),
                },
                state=RecordDict(),
                run_config=dict(run_config),
            )
            for pid, node in self.node_of_partition.items()
        }
        self.faults = {self.node_of_partition[p]: f for p, f in (faults or {}).items()}
        self.sent: list[Message] = []
        self._run_config = dict(run_config)
        self._num_nodes = num_nodes

    def add_node(
        self,
        partition_id: int,
        node_config: Mapping[str, Any] | None = None,
        *,
        fault: Fault | None = None,
    ) -> int:
        """Connect a new node (a new node id, as a SuperNode that reconnects gets) holding
        ``partition_id``; returns its node id."""
        node = max([*self.contexts, 90_000]) + 1
        self.contexts[node] = Context(
            run_id=1,
            node_id=node,
            node_config={
                "partition-id": partition_id,
                "num-partitions": self._num_nodes,
                **dict(node_config or {}),
            },
            state=RecordDict(),
            run_config=dict(self._run_config),
        )
        if fault is not None:
            self.faults[node] = fault
        return node

    def remove_node(self, node_id: int) -> None:
        """Disconnect ``node_id``: it is no longer among ``get_node_ids``."""
        del self.contexts[node_id]

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        replies = []
        for message in messages:
            self.sent.append(message)
            node = message.metadata.dst_node_id
            try:
                reply = self.app(message, self.contexts[node])
            except Exception as exc:  # noqa: BLE001 - a crashing client is what we simulate
                reply = Message(
                    Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, repr(exc)), reply_to=message
                )
            fault = self.faults.get(node)
            if fault is not None:
                reply = fault(plain_reply(reply))
            if isinstance(reply, list):
                replies.extend(reply)
            elif reply is not None:
                replies.append(reply)
        return replies

    # Not needed by the strategies: the rest of the Grid interface.
    def set_run(self, run: Any) -> None:
        raise NotImplementedError

    @property
    def run(self) -> Any:
        raise NotImplementedError

    def create_message(self, *args: Any, **kwargs: Any) -> Message:
        raise NotImplementedError

    def get_nodes(self) -> Iterable[Any]:
        raise NotImplementedError

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        raise NotImplementedError

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        raise NotImplementedError


def plain_reply(reply: Message) -> Message:
    """``reply`` with plain records, as the client's handler built it (a packed reply
    unpacked in place): what a fault alters, or a test reading replies off the grid."""
    if reply.has_content() and is_packed(reply.content):
        reply.content = unpack_content(reply.content)
    return reply


def replace_content(reply: Message, content: RecordDict, *, keep_nonce: bool = True) -> Message:
    """A reply to the same instruction carrying ``content`` instead: with ``keep_nonce``,
    ``reply``'s nonce too when ``content`` carries none (a client altering its answer
    still echoes the nonce it was sent; a stale ``content`` brings its own)."""
    nonce = reply.content.config_records.get(NONCE) if reply.has_content() else None
    if keep_nonce and nonce is not None and NONCE not in content.config_records:
        content = RecordDict({**dict(content.items()), NONCE: nonce})
    return Message(content, reply_to=_instruction_of(reply))


def error_reply(reply: Message, reason: str) -> Message:
    """What Flower delivers when the ClientApp raised: an error reply."""
    return Message(
        Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason), reply_to=_instruction_of(reply)
    )


def _instruction_of(reply: Message) -> Message:
    """Rebuild the instruction a reply answers (enough metadata for ``reply_to``)."""
    return Message(
        RecordDict(),
        dst_node_id=reply.metadata.src_node_id,
        message_type=reply.metadata.message_type,
    )
