"""How the records of several virtual clients share one Message in packed mode.

A packed message (server -> SuperNode) holds, besides the ConfigRecord ``packed`` (the
virtual clients' node ids, partition ids and message ids, in the order they are run), each
virtual client's records under ``f"v{i}:{name}"`` and its ``Context.state`` records under
``f"s{i}:{name}"`` (:func:`put`; the global model's arrays are one object shared by all).
The reply holds the same for each virtual client that answered, or a ConfigRecord
``f"e{i}"`` (error code and reason) for one whose handler raised; there the records travel
joined (:class:`ReplyWriter`): the arrays' ``.npy`` bytes and the MetricRecords /
ConfigRecords as Flower serialises them, back to back in blocks of about 16 MiB, with one
index of where each lies, so Flower moves a few objects per reply (in deployment each
object is a request) instead of several per virtual client; :func:`read_reply` turns them
back into the records the handlers returned (each array byte for byte). :func:`take`
splits either by virtual client. Names are those of :mod:`strategies.contract`.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence

from flwr.app import Array, ArrayRecord, ConfigRecord, Error, MetricRecord, RecordDict

from .. import contract as C
from .records import array_record

__all__ = ["ReplyWriter", "error_of", "error_record", "put", "read_reply", "take"]

_NAME = re.compile(r"^([vs])(\d{1,9}):(.+)$", re.DOTALL)
_ERROR = re.compile(rf"^{C.PACKED_ERROR}(\d{{1,9}})$")


def put(pack: RecordDict, index: int, kind: str, records: Mapping) -> None:
    """Add ``records`` (name -> record) to ``pack`` as virtual client ``index``'s ``kind``
    (``C.PACKED_CONTENT`` or ``C.PACKED_STATE``). The records are shared, not copied."""
    for name, record in records.items():
        pack[f"{kind}{index}:{name}"] = record


def error_record(error: Error) -> ConfigRecord:
    """The ConfigRecord ``f"e{i}"`` of a virtual client whose handler failed."""
    return ConfigRecord({C.PACKED_ERROR_CODE: int(error.code),
                         C.PACKED_ERROR_REASON: str(error.reason)})


def error_of(record: object) -> Error:
    """The Error an ``f"e{i}"`` record holds (a malformed one is an error too)."""
    if isinstance(record, ConfigRecord):
        code, reason = record.get(C.PACKED_ERROR_CODE), record.get(C.PACKED_ERROR_REASON)
        if isinstance(code, int) and isinstance(reason, str):
            return Error(code=code, reason=reason)
    return Error(code=0, reason=f"malformed packed error record {record!r}")


def take(pack: RecordDict) -> tuple[dict[int, dict[str, RecordDict]], dict[int, object],
                                      list[str]]:
    """Split ``pack`` by virtual client: ({index: {kind: RecordDict}}, {index: error record},
    names that follow neither scheme (besides ``C.PACKED``))."""
    parts: dict[int, dict[str, RecordDict]] = {}
    errors: dict[int, object] = {}
    unknown = []
    for name, record in pack.items():
        if name == C.PACKED:
            continue
        if (match := _NAME.match(name)) is not None:
            kind, index, inner = match.group(1), int(match.group(2)), match.group(3)
            parts.setdefault(index, {}).setdefault(kind, RecordDict())[inner] = record
        elif (match := _ERROR.match(name)) is not None:
            errors[int(match.group(1))] = record
        else:
            unknown.append(name)
    return parts, errors, unknown


# --------------------------------------------------------- a reply's records, joined
BLOCK_BYTES = 16 * 2**20  # a block closes once it holds this much (Flower's chunks are smaller)
SERIALIZED_KINDS = {"MetricRecord": MetricRecord, "ConfigRecord": ConfigRecord}
RECORD_LISTS = (C.PACKED_INDEX_RECORDS, C.PACKED_INDEX_RECORD_BLOCKS,
                C.PACKED_INDEX_RECORD_SIZES)
ARRAY_LISTS = (C.PACKED_INDEX_KEYS, C.PACKED_INDEX_DTYPES, C.PACKED_INDEX_STYPES,
               C.PACKED_INDEX_NDIMS, C.PACKED_INDEX_OFFSETS, C.PACKED_INDEX_SIZES)
SERIALIZED_LISTS = (C.PACKED_INDEX_SERIALIZED, C.PACKED_INDEX_SERIALIZED_KINDS,
                    C.PACKED_INDEX_SERIALIZED_BLOCKS, C.PACKED_INDEX_SERIALIZED_OFFSETS,
                    C.PACKED_INDEX_SERIALIZED_SIZES)
STR_LISTS = (C.PACKED_INDEX_ORDER, C.PACKED_INDEX_RECORDS, C.PACKED_INDEX_KEYS,
             C.PACKED_INDEX_DTYPES, C.PACKED_INDEX_STYPES, C.PACKED_INDEX_SERIALIZED,
             C.PACKED_INDEX_SERIALIZED_KINDS)
INT_LISTS = (C.PACKED_INDEX_RECORD_BLOCKS, C.PACKED_INDEX_RECORD_SIZES,
             C.PACKED_INDEX_NDIMS, C.PACKED_INDEX_DIMS, C.PACKED_INDEX_OFFSETS,
             C.PACKED_INDEX_SIZES, C.PACKED_INDEX_SERIALIZED_BLOCKS,
             C.PACKED_INDEX_SERIALIZED_OFFSETS, C.PACKED_INDEX_SERIALIZED_SIZES)


class ReplyWriter:
    """A packed reply, built one virtual client at a time (module docstring): the arrays'
    ``.npy`` bytes and the MetricRecords / ConfigRecords as Flower serialises them
    (``deflate``), back to back in blocks of about :data:`BLOCK_BYTES`, and the index."""

    def __init__(self) -> None:
        self.pack = RecordDict()
        self.blocks = ArrayRecord()
        self.pieces: list[bytes] = []
        self.size = 0  # bytes in the open block
        self.where: dict[int, int] = {}  # id of a bytes object in the open block -> offset
        self.index: dict[str, list] = {key: [] for key in STR_LISTS + INT_LISTS}

    def add(self, index: int, records: Sequence[tuple[str, Mapping]]) -> None:
        """Virtual client ``index``'s records, as (kind, {name: record}) pairs: records
        named ``f"{kind}{index}:{name}"`` (an array object returned twice is stored once)."""
        lists = self.index
        for kind, named in records:
            for name, record in named.items():
                full = f"{kind}{index}:{name}"
                lists[C.PACKED_INDEX_ORDER].append(full)
                if isinstance(record, ArrayRecord):
                    self.add_arrays(full, record)
                elif type(record) in (MetricRecord, ConfigRecord):
                    data = record.deflate()
                    lists[C.PACKED_INDEX_SERIALIZED].append(full)
                    lists[C.PACKED_INDEX_SERIALIZED_KINDS].append(type(record).__name__)
                    lists[C.PACKED_INDEX_SERIALIZED_BLOCKS].append(len(self.blocks))
                    lists[C.PACKED_INDEX_SERIALIZED_OFFSETS].append(self.put(data))
                    lists[C.PACKED_INDEX_SERIALIZED_SIZES].append(len(data))
                else:
                    self.pack[full] = record
        if self.size >= BLOCK_BYTES:
            self.close_block()

    def add_arrays(self, name: str, record: ArrayRecord) -> None:
        lists = self.index
        lists[C.PACKED_INDEX_RECORDS].append(name)
        lists[C.PACKED_INDEX_RECORD_BLOCKS].append(len(self.blocks))
        lists[C.PACKED_INDEX_RECORD_SIZES].append(len(record))
        for key, array in record.items():
            data = array.data
            lists[C.PACKED_INDEX_KEYS].append(key)
            lists[C.PACKED_INDEX_DTYPES].append(array.dtype)
            lists[C.PACKED_INDEX_STYPES].append(array.stype)
            lists[C.PACKED_INDEX_NDIMS].append(len(array.shape))
            lists[C.PACKED_INDEX_DIMS].extend(array.shape)
            lists[C.PACKED_INDEX_OFFSETS].append(self.put(data))
            lists[C.PACKED_INDEX_SIZES].append(len(data))

    def put(self, data: bytes) -> int:
        """Where ``data`` lies in the open block (added unless it is there already)."""
        offset = self.where.get(id(data))
        if offset is None:
            offset = self.where[id(data)] = self.size
            self.pieces.append(data)
            self.size += len(data)
        return offset

    def close_block(self) -> None:
        self.blocks[str(len(self.blocks))] = Array("uint8", (self.size,), C.PACKED_BYTES_STYPE,
                                                   b"".join(self.pieces))
        self.pieces, self.size, self.where = [], 0, {}

    def error(self, index: int, error: Error) -> None:
        """Virtual client ``index`` failed: its ``f"e{i}"`` record."""
        name = f"{C.PACKED_ERROR}{index}"
        self.index[C.PACKED_INDEX_ORDER].append(name)
        self.pack[name] = error_record(error)

    def finish(self) -> RecordDict:
        """The reply's content."""
        if self.index[C.PACKED_INDEX_RECORDS] or self.index[C.PACKED_INDEX_SERIALIZED]:
            if self.pieces or not self.blocks:  # the open block, or one (empty) at all
                self.close_block()
            self.pack[C.PACKED_BYTES] = self.blocks
            self.pack[C.PACKED_INDEX] = ConfigRecord(self.index)
        return self.pack


def read_reply(pack: RecordDict) -> RecordDict:
    """A packed reply's content as its handlers returned it: the records
    :class:`ReplyWriter` joined rebuilt (each array's bytes, dtype, shape and stype; each
    MetricRecord / ConfigRecord as Flower parses it), every record in the order written.
    Each block is dropped from ``pack`` once its last record is read, so the arrays are held
    about once. Raises ValueError saying what is malformed; a reply without joined records is
    returned as it is."""
    if C.PACKED_INDEX not in pack and C.PACKED_BYTES not in pack:
        return pack
    index, blocks = pack.get(C.PACKED_INDEX), pack.get(C.PACKED_BYTES)
    if not isinstance(index, ConfigRecord) or not isinstance(blocks, ArrayRecord):
        raise ValueError(f"needs a ConfigRecord '{C.PACKED_INDEX}' and an ArrayRecord "
                         f"'{C.PACKED_BYTES}'")
    lists = index_lists(index, pack)
    arrays = zip(*(lists[key] for key in ARRAY_LISTS))
    dims = iter(lists[C.PACKED_INDEX_DIMS])
    array_records = {name: (block, count) for name, block, count in
                     zip(*(lists[key] for key in RECORD_LISTS))}
    serialized = {name: (kind, block, offset, size) for name, kind, block, offset, size in
                  zip(*(lists[key] for key in SERIALIZED_LISTS))}
    order = lists[C.PACKED_INDEX_ORDER]
    block_of = {**{name: block for name, (block, _) in array_records.items()},
                **{name: entry[1] for name, entry in serialized.items()}}
    last_use = {block_of[name]: position for position, name in enumerate(order)
                if name in block_of}  # the last record read from each block
    out = RecordDict()
    for position, name in enumerate(order):
        if name in array_records:
            block, count = array_records[name]
            data, record = block_bytes(blocks, block, name), {}
            for key, dtype, stype, ndim, offset, size in itertools.islice(arrays, count):
                if offset + size > len(data) or key in record:
                    raise ValueError(f"record '{name}' array '{key}': bytes {offset} .. "
                                     f"{offset + size} of {len(data)}, or a repeated key")
                record[key] = Array(dtype, tuple(itertools.islice(dims, ndim)), stype,
                                    data[offset:offset + size])
            out[name] = array_record(record)
        elif name in serialized:
            kind, block, offset, size = serialized[name]
            data = block_bytes(blocks, block, name)
            if kind not in SERIALIZED_KINDS or offset + size > len(data):
                raise ValueError(f"record '{name}': a {kind!r} at bytes {offset} .. "
                                 f"{offset + size} of {len(data)}")
            try:
                out[name] = SERIALIZED_KINDS[kind].inflate(data[offset:offset + size])
            except Exception as exc:  # noqa: BLE001 - Flower's parser: any failure is malformed
                raise ValueError(f"record '{name}' is no {kind}: {exc}") from None
        else:
            out[name] = pack[name]
            continue
        if last_use.get(block) == position:
            del blocks[str(block)]  # its records are copied out: let the string go
    named = set(order) | {C.PACKED_INDEX, C.PACKED_BYTES}
    for name in pack.keys():
        if name not in named:
            out[name] = pack[name]  # not in the index: the caller drops it as a stray
    return out


def block_bytes(blocks: ArrayRecord, block: int, name: str) -> bytes:
    """The bytes of block ``block`` (record ``name`` reads from it)."""
    chunk = blocks.get(str(block))
    if not isinstance(chunk, Array) or chunk.stype != C.PACKED_BYTES_STYPE:
        raise ValueError(f"record '{name}': no byte block #{block}")
    return chunk.data


def index_lists(index: ConfigRecord, pack: RecordDict) -> dict[str, list]:
    """The lists of a reply's ``C.PACKED_INDEX``, checked: of their types, non-negative,
    of matching lengths, and ``order`` naming records of ``pack`` and each joined record,
    each once. Raises ValueError."""
    lists = {}
    for key in STR_LISTS + INT_LISTS:
        value = index.get(key)
        kind = str if key in STR_LISTS else int
        if not isinstance(value, list) or not all(
                type(v) is kind and (kind is str or v >= 0) for v in value):
            raise ValueError(f"index list '{key}' must be a list of "
                             f"{'str' if kind is str else 'int >= 0'}")
        lists[key] = value
    records = len(lists[C.PACKED_INDEX_RECORDS])
    arrays = sum(lists[C.PACKED_INDEX_RECORD_SIZES])
    serialized = len(lists[C.PACKED_INDEX_SERIALIZED])
    lengths = {key: len(lists[key]) for key in RECORD_LISTS + ARRAY_LISTS + SERIALIZED_LISTS}
    if (any(lengths[key] != records for key in RECORD_LISTS)
            or any(lengths[key] != arrays for key in ARRAY_LISTS)
            or any(lengths[key] != serialized for key in SERIALIZED_LISTS)
            or len(lists[C.PACKED_INDEX_DIMS]) != sum(lists[C.PACKED_INDEX_NDIMS])):
        raise ValueError(f"index lists of mismatched lengths: {lengths}, "
                         f"{len(lists[C.PACKED_INDEX_DIMS])} dims")
    order = lists[C.PACKED_INDEX_ORDER]
    joined = lists[C.PACKED_INDEX_RECORDS] + lists[C.PACKED_INDEX_SERIALIZED]
    carried = set(pack.keys()) - {C.PACKED_INDEX, C.PACKED_BYTES}
    if (len(set(order)) != len(order) or len(set(joined)) != len(joined)
            or not set(joined) <= set(order) or carried & set(joined)
            or not set(order) <= carried | set(joined)):
        raise ValueError(f"index list '{C.PACKED_INDEX_ORDER}' must name each record of the "
                         f"reply and each joined record once")
    return lists
