"""One array per message (``fedorasflwr.packing``, docs/protocol.md "Packed arrays"):
the packed form round-trips bit for bit, every malformed packed reply is dropped naming
the node and changes nothing, a malformed packed instruction gets an error reply, what
travels is one array each way, and a run with packed messages equals, to the bit, the
same run with plain ones (the ledger too: it counts plain bytes)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedorasflwr.client_app import app as client_app
from fedorasflwr.config import parse_run_config
from fedorasflwr.federation.base import NodeProfile
from fedorasflwr.federation.fedavg import SeededFedAvg
from fedorasflwr.inprocess import InProcessGrid, replace_content
from fedorasflwr.ledger import Ledger
from fedorasflwr.nonce import echo_nonce
from fedorasflwr.packing import (
    ALIGN,
    PACKED,
    PackingError,
    pack,
    pack_content,
    packed_messages,
    packing_versions,
    unpack,
    unpack_content,
)
from fedorasflwr.protocol import ARRAYS, CONFIG, METRICS, PACKING, PROFILE, QUERY_PROFILE
from fedorasflwr.server_app import runner
from tests.reliability.trials import comparable, run_config_for, same_weights
from tests.runconfig import FEW_ROWS

# --- the packed form -------------------------------------------------------------------


def _record(**arrays: np.ndarray) -> ArrayRecord:
    return ArrayRecord({k: Array(np.asarray(v)) for k, v in arrays.items()})


RECORDS = {
    "mixed": lambda: _record(
        a=np.arange(5, dtype=np.int64),
        b=np.array(3.5, np.float32),  # 0-d
        c=np.zeros((0, 3), np.float16),  # empty
        d=np.array([True, False, True]),
        e=np.arange(12.0).reshape(3, 4).T,  # not C-contiguous
        f=np.arange(10, dtype=np.float16)[::3],  # strided
        g=np.array([-1, 2**40], np.int64),
    ),
    "special-floats": lambda: _record(
        w=np.array([np.nan, -0.0, np.inf, -np.inf, 1e-45], np.float32),
        h=np.array([np.nan, 65504.0, -0.0], np.float16),
        c=np.array([1 + 2j], np.complex64),
        u=np.array([255, 0], np.uint8),
        big=np.array([1.5, 2.5], dtype=">f8"),  # another byte order, kept as it is
    ),
    "one-array": lambda: _record(w=np.ones((2, 3), np.float32)),
    "empty-last": lambda: _record(a=np.ones(3, bool), z=np.zeros((2, 0), np.float32)),
    "empty-record": ArrayRecord,
    "reversed-keys": lambda: _record(z=np.ones(1), y=np.zeros(2), x=np.arange(3)),
}


@pytest.mark.parametrize("name", RECORDS)
def test_unpack_gives_back_every_array_bit_for_bit(name):
    record = RECORDS[name]()
    packed, index = pack(record)
    assert list(packed.keys()) == [PACKED]
    assert packed[PACKED].numpy().dtype == np.uint8 and packed[PACKED].numpy().ndim == 1
    back = unpack(packed, index)
    assert list(back.keys()) == list(record.keys())  # same keys in the same order
    for key, array in record.items():
        sent, got = array.numpy(), back[key].numpy()
        assert got.dtype == sent.dtype and got.shape == sent.shape, key
        assert got.tobytes() == np.ascontiguousarray(sent).tobytes(), key  # bit for bit


def test_the_layout_by_hand():
    """int64[5] at 0 (40 bytes), a 0-d float32 at 40 (4 bytes), an empty float16 at 48
    (aligned; 0 bytes), bool[3] at 48 (3 bytes), float64[2, 2] at 56 (32 bytes): 88."""
    record = _record(
        a=np.arange(5, dtype=np.int64),
        b=np.array(7.0, np.float32),
        c=np.zeros(0, np.float16),
        d=np.array([True, False, True]),
        e=np.eye(2),
    )
    packed, index = pack(record)
    assert ALIGN == 8 and index["version"] == 1
    assert json.loads(str(index["index"])) == [
        ["a", "<i8", [5], 0],
        ["b", "<f4", [], 40],
        ["c", "<f2", [0], 48],
        ["d", "|b1", [3], 48],
        ["e", "<f8", [2, 2], 56],
    ]
    buffer = packed[PACKED].numpy()
    assert buffer.size == 88
    assert buffer[44:48].tolist() == [0, 0, 0, 0]  # padding is zeros
    assert buffer[48:51].tolist() == [1, 0, 1]
    assert buffer[40:44].view(np.float32)[0] == 7.0


def _edit_index(edit: Callable[[list], Any]) -> Callable[[ArrayRecord, ConfigRecord], None]:
    def change(arrays: ArrayRecord, packing: ConfigRecord) -> None:
        entries = json.loads(str(packing["index"]))
        edit(entries)
        packing["index"] = json.dumps(entries)

    return change


def _set(key: str, value: Any) -> Callable[[ArrayRecord, ConfigRecord], None]:
    def change(arrays: ArrayRecord, packing: ConfigRecord) -> None:
        packing[key] = value

    return change


def _buffer(
    edit: Callable[[np.ndarray], np.ndarray],
) -> Callable[[ArrayRecord, ConfigRecord], None]:
    def change(arrays: ArrayRecord, packing: ConfigRecord) -> None:
        arrays[PACKED] = Array(edit(arrays[PACKED].numpy()))

    return change


def _buffer_bytes(data: bytes) -> Callable[[ArrayRecord, ConfigRecord], None]:
    def change(arrays: ArrayRecord, packing: ConfigRecord) -> None:
        arrays[PACKED] = Array(dtype="uint8", shape=(len(data),), stype="numpy.ndarray", data=data)

    return change


def _entry(i: int, field: int, value: Any) -> Callable[[list], None]:
    def edit(entries: list) -> None:
        entries[i][field] = value

    return edit


def _second_array(arrays: ArrayRecord, packing: ConfigRecord) -> None:
    arrays["extra"] = Array(np.zeros(3, np.float32))


def _float_buffer(arrays: ArrayRecord, packing: ConfigRecord) -> None:
    arrays[PACKED] = Array(arrays[PACKED].numpy().view(np.float32))


#: malformed packed form -> the words the reason must contain
MALFORMED: dict[str, tuple[Callable[[ArrayRecord, ConfigRecord], None], str]] = {
    "unknown-version": (_set("version", 2), "unknown packing version 2"),
    "version-true": (_set("version", True), "unknown packing version"),
    "bad-json": (_set("index", '[["w", '), "not JSON"),
    "index-not-a-string": (_set("index", 7), "not a JSON string"),
    "index-not-a-list": (_set("index", '{"w": 1}'), "not a list"),
    "entry-not-four-fields": (_edit_index(lambda e: e[0].pop()), "is not [key, dtype, shape"),
    "duplicated-key": (_edit_index(lambda e: e[1].__setitem__(0, e[0][0])), "appears twice"),
    "object-dtype": (_edit_index(_entry(0, 1, "|O")), "is not allowed"),
    "string-dtype": (_edit_index(_entry(0, 1, "<U4")), "is not allowed"),
    "dtype-not-as-numpy-writes-it": (_edit_index(_entry(0, 1, "float32")), "is not allowed"),
    "negative-shape": (_edit_index(_entry(0, 2, [-2, 3])), "not integers >= 0"),
    "shape-overflowing-int64": (_edit_index(_entry(1, 2, [2**40, 2**40])), "past the buffer"),
    "too-many-axes": (_edit_index(_entry(1, 2, [1] * 33)), "more than 32"),
    "not-an-npy-buffer": (_buffer_bytes(b"not numpy at all"), "does not load"),
    "offset-overlaps": (_edit_index(_entry(1, 3, 0)), "starts at byte 0, not "),
    "offset-misaligned": (_edit_index(lambda e: e[1].__setitem__(3, e[1][3] + 4)), "starts at"),
    "shape-past-the-buffer": (_edit_index(_entry(1, 2, [10**9])), "past the buffer"),
    "buffer-too-short": (_buffer(lambda b: b[:-4]), "past the buffer"),
    "buffer-too-long": (_buffer(lambda b: np.concatenate([b, np.zeros(8, np.uint8)])), "holds"),
    "a-second-array": (_second_array, "holds one array"),
    "buffer-not-uint8": (_float_buffer, "not uint8 of one axis"),
}


def _good() -> tuple[ArrayRecord, ConfigRecord]:
    """w: float32[2, 3] (24 bytes) at 0, n: int64[2] at 24: 40 bytes."""
    return pack(_record(w=np.ones((2, 3), np.float32), n=np.array([1, 2], np.int64)))


@pytest.mark.parametrize("kind", MALFORMED)
def test_unpack_refuses_every_malformed_form_saying_what(kind):
    change, words = MALFORMED[kind]
    arrays, packing = _good()
    change(arrays, packing)
    with pytest.raises(PackingError, match=None) as caught:
        unpack(arrays, packing)
    assert words in str(caught.value)


def test_content_round_trip_keeps_every_other_record():
    content = RecordDict(
        {
            ARRAYS: _record(w=np.arange(4, dtype=np.float32)),
            CONFIG: ConfigRecord({"lr": 0.1}),
            METRICS: MetricRecord({"num-examples": 3}),
        }
    )
    packed = pack_content(content)
    assert list(packed.array_records[ARRAYS].keys()) == [PACKED] and PACKING in packed
    assert list(content.array_records[ARRAYS].keys()) == ["w"]  # the original is untouched
    assert pack_content(packed) is packed  # packed once only
    back = unpack_content(packed)
    assert PACKING not in back and set(back.keys()) == {ARRAYS, CONFIG, METRICS}
    assert back.array_records[ARRAYS]["w"].numpy().tolist() == [0, 1, 2, 3]
    no_arrays = pack_content(RecordDict({CONFIG: ConfigRecord({"a": 1})}))
    assert dict(no_arrays.config_records[PACKING]) == {"version": 1}
    assert set(unpack_content(no_arrays).keys()) == {CONFIG}
    plain = RecordDict({ARRAYS: _record(w=np.ones(2))})
    assert unpack_content(plain) is plain  # a plain record passes as it is
    with pytest.raises(PackingError, match="without a packing index"):
        unpack_content(
            RecordDict({ARRAYS: _record(w=np.ones(2)), PACKING: ConfigRecord({"version": 1})})
        )
    with pytest.raises(PackingError, match="no record 'arrays'"):
        unpack_content(RecordDict({PACKING: pack(_record(w=np.ones(2)))[1]}))


# --- the client side ----------------------------------------------------------------------


def _context(partition_id: int = 0) -> Context:
    return Context(
        run_id=1,
        node_id=7,
        node_config={"partition-id": partition_id, "num-partitions": 2},
        state=RecordDict(),
        run_config={},
    )


echo_app = ClientApp(mods=[echo_nonce, packed_messages])


@echo_app.train("echo")
def _echo(msg: Message, context: Context) -> Message:
    """Replies the arrays it read, each + (partition id + 1), counting partition id + 1
    examples (what the handler sees: plain records)."""
    arrays = msg.content.array_records[ARRAYS]
    assert PACKING not in msg.content and PACKED not in arrays
    step = int(context.node_config["partition-id"]) + 1
    out = ArrayRecord({k: Array(np.asarray(a.numpy() + step)) for k, a in arrays.items()})
    metrics = MetricRecord({"num-examples": step})
    return Message(RecordDict({ARRAYS: out, METRICS: metrics}), reply_to=msg)


@echo_app.query("profile")
def _profile(msg: Message, context: Context) -> Message:
    return Message(RecordDict({PROFILE: ConfigRecord({"partition-id": 0})}), reply_to=msg)


def _instruction(content: RecordDict, message_type: str = "train.echo") -> Message:
    InProcessGrid(echo_app, {}, 1)  # sets the task identity messages are made with
    return Message(content, dst_node_id=7, message_type=message_type)


def test_the_mod_unpacks_the_instruction_and_packs_the_reply_only_when_packed():
    arrays = _record(w=np.arange(3, dtype=np.float32), n=np.array(2, np.int64))
    packed = _instruction(pack_content(RecordDict({ARRAYS: arrays})))
    reply = echo_app(packed, _context())
    assert list(reply.content.array_records[ARRAYS].keys()) == [PACKED]
    assert PACKING in packed.content  # the instruction is left as it came
    back = unpack_content(reply.content).array_records[ARRAYS]
    assert back["w"].numpy().tolist() == [1, 2, 3] and back["n"].numpy().tolist() == 3
    plain = echo_app(_instruction(RecordDict({ARRAYS: arrays})), _context())
    assert list(plain.content.array_records[ARRAYS].keys()) == ["w", "n"]  # plain: plain


def test_a_profile_declares_the_versions_the_client_reads():
    reply = echo_app(_instruction(RecordDict(), QUERY_PROFILE), _context())
    assert reply.content.config_records[PROFILE]["packing"] == [1]
    profile = NodeProfile.from_reply(
        Message(
            RecordDict(
                {
                    PROFILE: ConfigRecord(
                        {
                            "partition-id": 0,
                            "num-partitions": 1,
                            "num-train": 1,
                            "num-val": 1,
                            "num-test": 1,
                            "label-counts": [1],
                            "packing": [1, 3],
                        }
                    )
                }
            ),
            reply_to=_instruction(RecordDict(), QUERY_PROFILE),
        )
    )
    assert profile.packing == (1, 3) and profile.reads_packed
    assert not NodeProfile(1, 0, 1, 1, 1, 1, ()).reads_packed  # declares nothing: plain
    assert not NodeProfile(1, 0, 1, 1, 1, 1, (), packing=(2,)).reads_packed  # not ours
    assert packing_versions({}) == ()
    for bad in ("1", [1.0], [-1], [True]):
        with pytest.raises(ValueError, match="packing = .* is not a list of integers"):
            packing_versions({"packing": bad})


@pytest.mark.parametrize("kind", ["unknown-version", "duplicated-key", "buffer-too-short"])
def test_a_malformed_packed_instruction_raises_which_flower_sends_back_as_an_error(kind):
    arrays, packing = _good()
    MALFORMED[kind][0](arrays, packing)
    message = _instruction(RecordDict({ARRAYS: arrays, PACKING: packing}))
    with pytest.raises(PackingError, match=MALFORMED[kind][1]):
        echo_app(message, _context())
    grid = InProcessGrid(echo_app, {}, 1)
    message = Message(
        RecordDict({ARRAYS: arrays, PACKING: packing}),
        dst_node_id=grid.node_of_partition[0],
        message_type="train.echo",
    )
    (reply,) = grid.send_and_receive([message])
    assert reply.has_error() and "PackingError" in reply.error.reason


# --- the server side: SeededFedAvg (Flower's start) --------------------------------------


def _profiles(grid: InProcessGrid, reads: bool) -> list[NodeProfile]:
    n = len(grid.node_of_partition)
    return [
        NodeProfile(node, pid, n, 1000, 1, 1, (), packing=(1,) if reads else ())
        for pid, node in grid.node_of_partition.items()
    ]


class WireGrid(InProcessGrid):
    """Records what each message and reply carried on the wire (array keys, packed?)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.wire: list[tuple[str, list[str], bool]] = []

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        replies = list(super().send_and_receive(messages, timeout=timeout))
        for side, batch in (("sent", messages), ("reply", replies)):
            for m in batch:
                if m.has_content():
                    arrays = m.content.array_records.get(ARRAYS)
                    self.wire.append((side, list(arrays or []), PACKING in m.content))
        return replies


def _fedavg(grid: InProcessGrid, reads: bool, ledger: Ledger) -> SeededFedAvg:
    return SeededFedAvg(
        nodes=_profiles(grid, reads),
        seed=0,
        stage="final",
        ledger=ledger,
        clients_per_round=len(grid.node_of_partition),
        min_replies=1,
        train_message_type="train.echo",
        fraction_evaluate=0.0,
    )


START = _record(w=np.zeros((2, 3), np.float32), b=np.arange(4, dtype=np.float64))


def test_fedavg_sends_and_receives_one_array_and_aggregates_as_with_plain_records():
    results = {}
    for reads in (True, False):
        grid = WireGrid(echo_app, {}, 3)
        ledger = Ledger()
        result = _fedavg(grid, reads, ledger).start(grid, START, num_rounds=2)
        results[reads] = (result.arrays, ledger.summary())
        packed_flags = {flag for _, _, flag in grid.wire}
        assert packed_flags == {reads}
        keys = {tuple(k) for _, k, _ in grid.wire}
        assert keys == ({(PACKED,)} if reads else {("w", "b")})
        assert len(grid.wire) == 2 * 2 * 3  # 2 rounds x 3 nodes, message and reply
    (packed, packed_ledger), (plain, plain_ledger) = results[True], results[False]
    for key in START.keys():
        assert packed[key].numpy().tobytes() == plain[key].numpy().tobytes()
    assert packed_ledger == plain_ledger  # plain bytes both ways


def _malformed_reply(kind: str) -> Callable[[Message], Message]:
    """A fault: the node's reply packed, then made malformed the ``kind`` way."""
    change = MALFORMED[kind][0]

    def fault(reply: Message) -> Message:
        if reply.has_error() or not reply.metadata.message_type.startswith("train."):
            return reply
        content = pack_content(reply.content)
        arrays = ArrayRecord(dict(content.array_records[ARRAYS].items()))
        packing = ConfigRecord(dict(content.config_records[PACKING].items()))
        change(arrays, packing)
        return replace_content(
            reply, RecordDict({**dict(content.items()), ARRAYS: arrays, PACKING: packing})
        )

    return fault


FEDAVG_KINDS = list(MALFORMED)


def test_fedavg_drops_every_malformed_packed_reply_naming_the_node(caplog):
    kinds = FEDAVG_KINDS
    faults = {pid: _malformed_reply(kind) for pid, kind in enumerate(kinds)}
    grid = InProcessGrid(echo_app, {}, len(kinds) + 2, faults=faults)
    ledger = Ledger()
    with caplog.at_level(logging.WARNING, logger="flwr"):
        result = _fedavg(grid, True, ledger).start(grid, START, num_rounds=1)
    # only the two honest nodes (partition ids n-2, n-1: n-1 and n examples) count
    n = len(kinds) + 2
    w = ((n - 1) * (n - 1) + n * n) / ((n - 1) + n)
    assert np.allclose(result.arrays["w"].numpy(), w)
    nodes = ledger.summary()["final"]["nodes"]
    for pid, kind in enumerate(kinds):
        node = grid.node_of_partition[pid]
        assert nodes[str(node)]["rejected"] == 1, kind
        assert any(
            f"dropped reply of node {node}: malformed packed arrays" in r.getMessage()
            for r in caplog.records
        ), kind
        assert nodes[str(node)].get("timed_out", 0) == 0, kind  # booked once


# --- the server side: a method's exchange, and every method packed vs plain -------------


def _run(method: str, config: dict[str, Any], out: Path, faults=None, grid_type=InProcessGrid):
    grid = grid_type(client_app, config, NODES, faults=faults)
    out.mkdir(parents=True, exist_ok=True)
    return grid, runner(method)(grid, parse_run_config(config), out)


NODES = 5


def _fedoras_config(cache: Path) -> dict[str, Any]:
    return {
        **run_config_for("fedoras", cache),
        "fedoras.clients-per-round": NODES,
        "fedoras.rounds": 1,
        "fedoras.batch-size": 128,
        **FEW_ROWS,  # the claims hold at any data size
    }


@pytest.mark.parametrize(
    "kinds",
    [
        ["unknown-version", "bad-json", "duplicated-key"],
        ["object-dtype", "offset-overlaps", "buffer-too-long"],
        ["buffer-too-short", "a-second-array", "offset-misaligned"],
    ],
)
def test_a_methods_exchange_drops_malformed_packed_replies_and_changes_nothing(
    data_cache, tmp_path, caplog, kinds
):
    """FedorAS Stage 1 (``exchange``): three nodes send malformed packed replies, each
    dropped, named and booked as rejected; the run equals to the bit the one in which
    those three never answered."""
    config = _fedoras_config(data_cache)
    faults = {pid: _malformed_reply(kind) for pid, kind in enumerate(kinds)}
    with caplog.at_level(logging.WARNING, logger="flwr"):
        grid, attacked = _run("fedoras", config, tmp_path / "attacked", faults)
    silent = {
        pid: (lambda r: r if not r.metadata.message_type.startswith("train.") else None)
        for pid in range(len(kinds))
    }
    _, quiet = _run("fedoras", config, tmp_path / "quiet", silent)
    assert comparable(attacked) == comparable(quiet)
    assert same_weights(tmp_path / "attacked", tmp_path / "quiet")
    nodes = attacked["ledger"]["supernet"]["nodes"]
    for pid, kind in enumerate(kinds):
        node = grid.node_of_partition[pid]
        assert nodes[str(node)]["rejected"] == 1, kind
        assert nodes[str(node)]["timed_out"] == 0, kind  # booked once
        assert any(
            f"dropped reply of node {node}: malformed packed arrays: " in r.getMessage()
            and MALFORMED[kind][1] in r.getMessage()
            for r in caplog.records
        ), kind


class PlainProfiles:
    """Every node declared to read plain records only: the same run without packing."""

    def __enter__(self) -> None:
        self.saved = NodeProfile.reads_packed
        NodeProfile.reads_packed = property(lambda self: False)  # type: ignore[assignment]

    def __exit__(self, *exc: object) -> None:
        NodeProfile.reads_packed = self.saved  # type: ignore[assignment]


def _method_config(method: str, cache: Path) -> dict[str, Any]:
    """``method``'s reliability trial config, every client on 64 rows (``FEW_ROWS``)."""
    if method == "heterofl":
        config = {
            **run_config_for("fedoras", cache),
            "method": "heterofl",
            "heterofl.rounds": 1,
            "heterofl.lr-probe": False,  # server-side steps before round 1: nothing is sent
        }
    elif method == "fednas":
        config = {**run_config_for(method, cache), "fednas.rounds": 1}
    else:
        config = run_config_for(method, cache)
    return {**config, **FEW_ROWS}


@pytest.mark.parametrize("method", ["fedoras", "decnas", "fdnas", "dpfnas", "fednas", "heterofl"])
def test_a_packed_run_equals_the_plain_run_to_the_bit(data_cache, tmp_path, method):
    config = _method_config(method, data_cache)
    grid, packed = _run(method, config, tmp_path / "packed", grid_type=WireGrid)
    with PlainProfiles():
        plain_grid, plain = _run(method, config, tmp_path / "plain", grid_type=WireGrid)
    assert comparable(packed) == comparable(plain)
    assert same_weights(tmp_path / "packed", tmp_path / "plain")
    assert _same_bytes(packed["ledger"], plain["ledger"])
    # packed: every message and reply with arrays carried one; plain: none was packed
    with_arrays = [keys for _, keys, _ in grid.wire if keys]
    assert with_arrays and all(keys == [PACKED] for keys in with_arrays)
    assert {kind for kind, keys, _ in grid.wire if keys} == {"sent", "reply"}
    assert not any(flag for _, _, flag in plain_grid.wire)


def _same_bytes(first: dict, second: dict) -> bool:
    """The two ledgers' byte counts, stage by stage and node by node (times differ)."""

    def byte_counts(value: Any, path: str = "") -> dict[str, int]:
        if isinstance(value, dict):
            out: dict[str, int] = {}
            for k, v in value.items():
                out |= byte_counts(v, f"{path}/{k}")
            return out
        return {path: value} if "bytes" in path.rsplit("/", 1)[-1] else {}

    found = byte_counts(first)
    return bool(found) and found == byte_counts(second)
