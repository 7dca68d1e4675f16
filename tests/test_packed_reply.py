"""A packed reply's records travel joined, in a few byte blocks
(strategies.engine.packed_records.ReplyWriter / read_reply): they come back as written (arrays byte
for byte), in the order written, and a malformed index is a clear error that costs only its
worker's share."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, MetricRecord, RecordDict

from strategies import contract as C
from strategies.client import virtual_clients
from strategies.engine import packed_records
from strategies.engine.packed_records import ReplyWriter, read_reply
from strategies.engine.packing import PackedGrid
from tests.inprocess import InProcessGrid, adding_app
from tests.test_packing import exchange, train_messages


def same_arrays(a: ArrayRecord, b: ArrayRecord) -> bool:
    return list(a) == list(b) and all(
        (x.dtype, tuple(x.shape), x.stype, x.data) == (y.dtype, tuple(y.shape), y.stype, y.data)
        for x, y in zip(a.values(), b.values()))


def written():
    """A reply of three virtual clients: 0 answered (arrays of several kinds, state), 1
    failed, 2 answered with an empty ArrayRecord and one array object twice."""
    shared = Array(np.arange(6, dtype=np.float32).reshape(2, 3))
    first = RecordDict({
        C.ARRAYS: ArrayRecord({"w": shared, "count": Array(np.array(7, dtype=np.int64)),
                               "empty": Array(np.zeros((0, 4), dtype=np.float64)),
                               "fortran": Array(np.asfortranarray(np.ones((2, 2))))}),
        C.METRICS: MetricRecord({C.NUM_EXAMPLES: 5})})
    state = {"c": ArrayRecord({"c": Array(np.full(3, 0.5))})}
    third = RecordDict({"none": ArrayRecord(), C.ARRAYS: ArrayRecord({"a": shared, "b": shared}),
                        C.METRICS: MetricRecord({C.NUM_EXAMPLES: 2})})
    writer = ReplyWriter()
    writer.add(0, [(C.PACKED_CONTENT, first), (C.PACKED_STATE, state)])
    writer.error(1, Error(code=3, reason="broke"))
    writer.add(2, [(C.PACKED_CONTENT, third), (C.PACKED_STATE, {})])
    records = {**{f"v0:{k}": v for k, v in first.items()}, "s0:c": state["c"],
               "e1": None, **{f"v2:{k}": v for k, v in third.items()}}
    return writer.finish(), records


def test_the_records_come_back_as_written_in_the_order_written():
    pack, records = written()
    assert list(pack[C.PACKED_BYTES]) == ["0"]  # one block: it holds less than BLOCK_BYTES
    assert set(pack) == {"e1", C.PACKED_BYTES, C.PACKED_INDEX}  # the rest is joined
    back = read_reply(pack)
    assert list(back) == list(records)
    for name, original in records.items():
        if isinstance(original, ArrayRecord):
            assert same_arrays(back[name], original), name
        elif isinstance(original, MetricRecord):
            assert type(back[name]) is MetricRecord and dict(back[name]) == dict(original)
    assert back["e1"]["reason"] == "broke"
    assert len(pack[C.PACKED_BYTES]) == 0  # each block let go once read


def test_an_array_returned_twice_is_stored_once_and_blocks_close_at_their_size(monkeypatch):
    pack, records = written()
    shared = len(records["v2:arrays"]["a"].data)
    index = pack[C.PACKED_INDEX]
    offsets = index[C.PACKED_INDEX_OFFSETS]
    assert offsets[-1] == offsets[-2]  # v2's "a" and "b": the same bytes
    monkeypatch.setattr(packed_records, "BLOCK_BYTES", shared)
    pack, records = written()
    assert len(pack[C.PACKED_BYTES]) == 2  # client 0 filled block 0; client 2 is in block 1
    back = read_reply(pack)
    assert same_arrays(back["v2:arrays"], records["v2:arrays"])
    assert same_arrays(back["v0:arrays"], records["v0:arrays"])


def test_a_reply_of_errors_only_is_left_as_it_is():
    writer = ReplyWriter()
    writer.add(0, [(C.PACKED_CONTENT, {})])
    writer.error(1, Error(code=3, reason="broke"))
    pack = writer.finish()
    assert C.PACKED_INDEX not in pack and read_reply(pack) is pack


def spoilt(change) -> RecordDict:
    pack, _ = written()
    index = dict(pack[C.PACKED_INDEX].items())
    change(index, pack)
    pack[C.PACKED_INDEX] = ConfigRecord(index)
    return pack


def put_back(key, value):
    return lambda index, pack: index.__setitem__(key, value)


@pytest.mark.parametrize("change, why", [
    (lambda index, pack: pack.__delitem__(C.PACKED_BYTES), "needs a ConfigRecord"),
    (put_back(C.PACKED_INDEX_OFFSETS, "0"), "'offsets' must be a list of int >= 0"),
    (lambda index, pack: index[C.PACKED_INDEX_OFFSETS].__setitem__(0, -1), "int >= 0"),
    (lambda index, pack: index[C.PACKED_INDEX_KEYS].pop(), "mismatched lengths"),
    (lambda index, pack: index[C.PACKED_INDEX_DIMS].append(1), "mismatched lengths"),
    (lambda index, pack: index[C.PACKED_INDEX_SIZES].__setitem__(0, 10**9), "bytes 0 .. "),
    (lambda index, pack: index[C.PACKED_INDEX_KEYS].__setitem__(1, "w"), "repeated key"),
    (lambda index, pack: index[C.PACKED_INDEX_RECORD_BLOCKS].__setitem__(0, 1),
     "no byte block #1"),
    (lambda index, pack: index[C.PACKED_INDEX_SERIALIZED_KINDS].__setitem__(0, "Evil"),
     "a 'Evil' at bytes"),
    (lambda index, pack: index[C.PACKED_INDEX_SERIALIZED_OFFSETS].__setitem__(0, 1),
     "is no MetricRecord"),
    (lambda index, pack: index[C.PACKED_INDEX_SERIALIZED_KINDS].__setitem__(0, "ConfigRecord"),
     "is no ConfigRecord"),
    (lambda index, pack: index[C.PACKED_INDEX_ORDER].append("e1"), "each joined record once"),
    (lambda index, pack: index[C.PACKED_INDEX_ORDER].remove("v0:arrays"), "each joined record once"),
])
def test_a_malformed_index_is_a_clear_error(change, why):
    with pytest.raises(ValueError, match=why.replace("(", r"\(")):
        read_reply(spoilt(change))


def test_a_worker_whose_index_is_malformed_fails_its_own_share_only():
    class Spoiling(InProcessGrid):
        def deliver(self, msg, timeout=None):
            reply = super().deliver(msg, timeout)
            if msg.metadata.dst_node_id == self.node_ids[0]:
                index = dict(reply.content[C.PACKED_INDEX].items())
                index[C.PACKED_INDEX_SIZES] = [10**9] * len(index[C.PACKED_INDEX_SIZES])
                reply.content[C.PACKED_INDEX] = ConfigRecord(index)
            return reply

    grid = PackedGrid(Spoiling(adding_app(mods=[virtual_clients]), 2, {}), 6)
    replies = exchange(grid, train_messages(grid, list(grid.get_node_ids())))
    failed = [r for r in replies if r.has_error()]
    assert len(replies) == 6 and 0 < len(failed) < 6
    first = grid.grid.node_ids[0]
    assert all(f"SuperNode {first}, which served it packed, sent a malformed reply"
               in r.error.reason for r in failed)
