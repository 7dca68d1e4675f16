"""Reading a checkpoint's ``.npz`` that may be hostile: no pickle, no allocation larger
than the bytes on disk, no inflation.

``np.savez`` stores each array uncompressed (``ZIP_STORED``) as an ``.npy`` member whose
size is its header plus ``prod(shape) * itemsize``. :func:`read_npz` accepts exactly
that: a deflated member (a zip bomb: 0.5 MB on disk, 512 MiB inflated) is refused, and so
is a header whose shape claims more bytes than its member holds (a 4 TiB claim would make
``np.load`` allocate 4 TiB before reading one byte). Every refusal is an
:class:`NpzFormatError` naming the member and what it claims.
"""

from __future__ import annotations

import math
import zipfile
from pathlib import Path

import numpy as np
from numpy.lib import format as npy

MAX_MEMBERS = 100_000  # a checkpoint holds one array per model tensor and state entry


class NpzFormatError(ValueError):
    """An ``.npz`` member that ``np.savez`` did not write as it is."""


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """The arrays of ``path`` by name (``a0`` for ``a0.npy``), read member by member after
    its header and size agree (module docstring)."""
    arrays: dict[str, np.ndarray] = {}
    with zipfile.ZipFile(Path(path)) as archive:
        members = archive.infolist()
        if len(members) > MAX_MEMBERS:
            raise NpzFormatError(f"{len(members)} members, more than a checkpoint holds "
                                 f"({MAX_MEMBERS})")
        for member in members:
            name = member.filename.removesuffix(".npy")
            if name == member.filename or name in arrays:
                raise NpzFormatError(f"member {member.filename!r} is not one .npy of np.savez")
            if member.compress_type != zipfile.ZIP_STORED or member.file_size != member.compress_size:
                raise NpzFormatError(f"member {member.filename!r} is compressed ({member.file_size}"
                                     f" bytes from {member.compress_size}); np.savez stores "
                                     "arrays uncompressed")
            with archive.open(member) as handle:
                arrays[name] = _read_member(handle, member)
    return arrays


def _read_member(handle, member: zipfile.ZipInfo) -> np.ndarray:
    version = npy.read_magic(handle)
    if version not in ((1, 0), (2, 0), (3, 0)):
        raise NpzFormatError(f"member {member.filename!r}: .npy version {version}")
    read_header = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
    shape, fortran_order, dtype = read_header(handle)
    if dtype.hasobject:
        raise NpzFormatError(f"member {member.filename!r} holds Python objects (dtype {dtype}),"
                             " which only a pickle could load (allow_pickle=False)")
    claimed = math.prod(shape) * dtype.itemsize
    if handle.tell() + claimed != member.file_size:
        raise NpzFormatError(f"member {member.filename!r}: its header claims shape {shape} of "
                             f"{dtype} ({claimed} bytes) but the member holds "
                             f"{member.file_size - handle.tell()} bytes of data")
    if dtype.itemsize == 0:
        return np.empty(shape, dtype=dtype)
    data = bytearray(claimed)  # writable, read in place: one copy of the array in memory
    if handle.readinto(data) != claimed:
        raise NpzFormatError(f"member {member.filename!r} ends before its {claimed} bytes")
    flat = np.frombuffer(data, dtype=dtype)
    return flat.reshape(shape[::-1]).T if fortran_order else flat.reshape(shape)
