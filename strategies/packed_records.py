"""How the records of several virtual clients share one Message in packed mode.

A packed message (server -> SuperNode) holds, besides the ConfigRecord ``packed`` (the
virtual clients' node ids, partition ids and message ids, in the order they are run), each
virtual client's records under ``f"v{i}:{name}"`` and its ``Context.state`` records under
``f"s{i}:{name}"`` (:func:`put`; the global model's arrays are one object shared by all).
The reply holds the same for each virtual client that answered, or a ConfigRecord
``f"e{i}"`` (error code and reason) for one whose handler raised; there the arrays of a
client's ArrayRecords travel as one byte string per client (their ``.npy`` bytes back to
back, :class:`ReplyWriter`) with one index of where each array lies, so Flower
(de)serialises one object per virtual client instead of one per array;
:func:`read_reply` turns them back into the ArrayRecords the handlers returned, byte for
byte. :func:`take` splits either by virtual client. Names are those of
:mod:`strategies.contract`.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence

from flwr.app import Array, ArrayRecord, ConfigRecord, Error, RecordDict

from . import contract as C

__all__ = ["ReplyWriter", "error_of", "error_record", "put", "read_reply", "take"]

KINDS = (C.PACKED_CONTENT, C.PACKED_STATE)
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


# --------------------------------------------------------- a reply's arrays, joined
RECORD_LISTS = (C.PACKED_INDEX_RECORDS, C.PACKED_INDEX_RECORD_CLIENTS,
                C.PACKED_INDEX_RECORD_SIZES)
ARRAY_LISTS = (C.PACKED_INDEX_KEYS, C.PACKED_INDEX_DTYPES, C.PACKED_INDEX_STYPES,
               C.PACKED_INDEX_NDIMS, C.PACKED_INDEX_OFFSETS, C.PACKED_INDEX_SIZES)
STR_LISTS = (C.PACKED_INDEX_ORDER, C.PACKED_INDEX_RECORDS, C.PACKED_INDEX_KEYS,
             C.PACKED_INDEX_DTYPES, C.PACKED_INDEX_STYPES)
INT_LISTS = (C.PACKED_INDEX_RECORD_CLIENTS, C.PACKED_INDEX_RECORD_SIZES,
             C.PACKED_INDEX_NDIMS, C.PACKED_INDEX_DIMS, C.PACKED_INDEX_OFFSETS,
             C.PACKED_INDEX_SIZES)


class ReplyWriter:
    """A packed reply, built one virtual client at a time (module docstring)."""

    def __init__(self) -> None:
        self.pack = RecordDict()
        self.chunks = ArrayRecord()
        self.index: dict[str, list] = {key: [] for key in STR_LISTS + INT_LISTS}

    def add(self, index: int, records: Sequence[tuple[str, Mapping]]) -> None:
        """Virtual client ``index``'s records, as (kind, {name: record}) pairs: records
        named ``f"{kind}{index}:{name}"``; its arrays' bytes joined into one string (an
        array object it returns twice is stored once)."""
        pieces, where, size = [], {}, 0
        lists = self.index
        for kind, named in records:
            for name, record in named.items():
                full = f"{kind}{index}:{name}"
                lists[C.PACKED_INDEX_ORDER].append(full)
                if not isinstance(record, ArrayRecord):
                    self.pack[full] = record
                    continue
                lists[C.PACKED_INDEX_RECORDS].append(full)
                lists[C.PACKED_INDEX_RECORD_CLIENTS].append(index)
                lists[C.PACKED_INDEX_RECORD_SIZES].append(len(record))
                for key, array in record.items():
                    data = array.data
                    if id(data) not in where:
                        where[id(data)] = size
                        pieces.append(data)
                        size += len(data)
                    lists[C.PACKED_INDEX_KEYS].append(key)
                    lists[C.PACKED_INDEX_DTYPES].append(array.dtype)
                    lists[C.PACKED_INDEX_STYPES].append(array.stype)
                    lists[C.PACKED_INDEX_NDIMS].append(len(array.shape))
                    lists[C.PACKED_INDEX_DIMS].extend(array.shape)
                    lists[C.PACKED_INDEX_OFFSETS].append(where[id(data)])
                    lists[C.PACKED_INDEX_SIZES].append(len(data))
        if pieces:
            self.chunks[str(index)] = Array("uint8", (size,), C.PACKED_BYTES_STYPE,
                                            b"".join(pieces))

    def error(self, index: int, error: Error) -> None:
        """Virtual client ``index`` failed: its ``f"e{i}"`` record."""
        name = f"{C.PACKED_ERROR}{index}"
        self.index[C.PACKED_INDEX_ORDER].append(name)
        self.pack[name] = error_record(error)

    def finish(self) -> RecordDict:
        """The reply's content."""
        if self.index[C.PACKED_INDEX_RECORDS]:
            self.pack[C.PACKED_BYTES] = self.chunks
            self.pack[C.PACKED_INDEX] = ConfigRecord(self.index)
        return self.pack


def read_reply(pack: RecordDict) -> RecordDict:
    """A packed reply's content as its handlers returned it: the ArrayRecords
    :class:`ReplyWriter` joined rebuilt (the same bytes, dtype, shape and stype per array),
    every record in the order written. Each client's byte string is dropped from ``pack``
    once its records are read, so the arrays are held about once. Raises ValueError saying
    what is malformed; a reply without joined arrays is returned as it is."""
    if C.PACKED_INDEX not in pack and C.PACKED_BYTES not in pack:
        return pack
    index, chunks = pack.get(C.PACKED_INDEX), pack.get(C.PACKED_BYTES)
    if not isinstance(index, ConfigRecord) or not isinstance(chunks, ArrayRecord):
        raise ValueError(f"needs a ConfigRecord '{C.PACKED_INDEX}' and an ArrayRecord "
                         f"'{C.PACKED_BYTES}'")
    lists = index_lists(index, pack)
    arrays = zip(*(lists[key] for key in ARRAY_LISTS))
    dims = iter(lists[C.PACKED_INDEX_DIMS])
    rebuilt: dict[str, ArrayRecord] = {}
    records = list(zip(*(lists[key] for key in RECORD_LISTS)))
    for number, (name, client, count) in enumerate(records):
        chunk = chunks.get(str(client))
        if not isinstance(chunk, Array) or chunk.stype != C.PACKED_BYTES_STYPE:
            raise ValueError(f"record '{name}': no byte string of virtual client #{client}")
        data, record = chunk.data, {}
        for key, dtype, stype, ndim, offset, size in itertools.islice(arrays, count):
            if offset + size > len(data) or key in record:
                raise ValueError(f"record '{name}' array '{key}': bytes {offset} .. "
                                 f"{offset + size} of {len(data)}, or a repeated key")
            record[key] = Array(dtype, tuple(itertools.islice(dims, ndim)), stype,
                                data[offset:offset + size])
        rebuilt[name] = ArrayRecord(record)
        if number + 1 == len(records) or records[number + 1][1] != client:
            del chunks[str(client)]  # its arrays are copied out: let the string go
    order = lists[C.PACKED_INDEX_ORDER]
    named = set(order) | {C.PACKED_INDEX, C.PACKED_BYTES}
    extra = [name for name in pack.keys() if name not in named]  # the caller drops strays
    return RecordDict({name: rebuilt[name] if name in rebuilt else pack[name]
                       for name in order + extra})


def index_lists(index: ConfigRecord, pack: RecordDict) -> dict[str, list]:
    """The lists of a reply's ``C.PACKED_INDEX``, checked: of their types, non-negative,
    of matching lengths, and ``order`` naming records of ``pack`` and each joined
    ArrayRecord, each once. Raises ValueError."""
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
    lengths = {key: len(lists[key]) for key in RECORD_LISTS + ARRAY_LISTS}
    if (any(lengths[key] != records for key in RECORD_LISTS)
            or any(lengths[key] != arrays for key in ARRAY_LISTS)
            or len(lists[C.PACKED_INDEX_DIMS]) != sum(lists[C.PACKED_INDEX_NDIMS])):
        raise ValueError(f"index lists of mismatched lengths: {lengths}, "
                         f"{len(lists[C.PACKED_INDEX_DIMS])} dims")
    order, joined = lists[C.PACKED_INDEX_ORDER], lists[C.PACKED_INDEX_RECORDS]
    carried = set(pack.keys()) - {C.PACKED_INDEX, C.PACKED_BYTES}
    if (len(set(order)) != len(order) or len(set(joined)) != len(joined)
            or not set(joined) <= set(order) or carried & set(joined)
            or not set(order) <= carried | set(joined)):
        raise ValueError(f"index list '{C.PACKED_INDEX_ORDER}' must name each record of the "
                         f"reply and each joined ArrayRecord once")
    return lists
