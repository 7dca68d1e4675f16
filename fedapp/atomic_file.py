"""Write a file so that a crash or a full disk leaves either the old file or the new one.

:func:`write_atomically` writes a temporary file beside the target (``.<name>.<pid>.tmp``),
flushes and fsyncs it, ``os.replace``s it over the target and fsyncs the folder, so the
rename itself survives a power cut. On any failure the temporary file is removed and the
error names the target path (a write error of an open file names none by itself).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def fsync_directory(path: Path) -> None:
    """fsync a folder, so that the names created or renamed in it are on disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, write: Callable[[BinaryIO], None]) -> Path:
    """Replace ``path`` by what ``write(handle)`` writes to a binary handle, atomically.

    Raises OSError (errno kept, ``filename`` = ``path``) when the disk is full or the write
    fails otherwise; ``path`` is then as it was, and no temporary file is left.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        fsync_directory(path.parent)
    except OSError as exc:
        _remove(tmp)
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
    except BaseException:
        _remove(tmp)
        raise
    return path


def _remove(tmp: Path) -> None:
    with contextlib.suppress(OSError):  # the error that got us here is the one to report
        tmp.unlink(missing_ok=True)


def write_bytes_atomically(path: Path, data: bytes) -> Path:
    """:func:`write_atomically` of ``data``."""
    return write_atomically(path, lambda handle: handle.write(data))
