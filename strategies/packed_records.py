"""How the records of several virtual clients share one Message in packed mode.

A packed message (server -> SuperNode) holds, besides the ConfigRecord ``packed`` (the
virtual clients' node ids, partition ids and message ids, in the order they are run), each
virtual client's records under ``f"v{i}:{name}"`` and its ``Context.state`` records under
``f"s{i}:{name}"``. The reply holds the same for each virtual client that answered, or a
ConfigRecord ``f"e{i}"`` (error code and reason) for one whose handler raised. Both sides
(:mod:`strategies.packing`, :mod:`strategies.client.packing`) use :func:`put` and
:func:`take`; names are those of :mod:`strategies.contract`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from flwr.app import ConfigRecord, Error, RecordDict

from . import contract as C

__all__ = ["error_of", "error_record", "put", "take"]

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
