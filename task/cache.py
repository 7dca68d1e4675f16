"""An on-disk cache of numpy arrays per node, memory-mapped back in milliseconds.

Flower's deployment SuperNode starts a new ClientApp process for every message, so a
per-process cache never gets a second hit; decoding Fashion-MNIST and a Dirichlet
partition of its 60k labels cost seconds in every process. This cache keeps such
arrays on the node's disk (:func:`task.data.load_partition` puts the decoded dataset
and the partition index arrays here); numpy and the standard library only, no torch.

An entry is a folder ``<root>/<name>/`` holding one ``<array>.npy`` per array and a
``manifest.json``:

* ``name`` is the sha256 of the entry's *request*: everything that selects the arrays
  (dataset, the source files' paths, ``normalize``, partition scheme and parameters,
  seed, number of partitions, the versions of the code and libraries that compute them);
* the manifest repeats the request and adds the *identity* of what the arrays were
  computed from (the source files' sizes and modification times), per array its dtype,
  shape, size in bytes and sha256, and the file's stat (inode, size, mtime, ctime) when
  that checksum was last verified.

Reading (:meth:`ArrayCache.load`), under a shared ``flock`` on ``<root>/<name>.lock``:
the manifest's request and identity must equal the caller's (else the entry is
*stale*); every file must have its manifest size, and its stat must equal the verified
stat, else its sha256 is recomputed in full and must match (else the entry is
*corrupt*). Unchanged files are therefore trusted without reading them: a write to a
file changes its ctime, which no process can set back. Arrays are mapped copy-on-write
(``np.load(mmap_mode="c")``) and read-only. A process keeps the entries it verified and
hands them out again while the manifest's and every file's stat are unchanged (a
simulation's actor reads hundreds of partitions per round from the same two entries), so
a repeated read costs a few ``stat`` calls and still notices a rebuilt or rewritten entry.

Writing, under an exclusive ``flock``: the arrays go into a temporary folder next to the
entry, each file fsynced and hashed, then the manifest; the folder is renamed into place
(a stale or corrupt entry is first renamed aside and removed). A crash leaves either the
old entry or the new one, never half of one; several processes filling the same entry at
once (SuperNodes sharing a machine) build it once, the others wait and map it. A stale
or corrupt entry is rebuilt with one WARNING line saying why. ``flock`` needs a local
file system: put the cache on a node-local disk, not NFS.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Flower's logger: cache messages appear where the ClientApp's and ServerApp's logs go
LOGGER = logging.getLogger("flwr")
FORMAT = 1  # bump when the entry layout changes
MANIFEST = "manifest.json"
ROOT_ENV = "FEDHETERO_DATA_CACHE"  # overrides the default folder (tests, fast local disks)

Builder = Callable[[], tuple[Mapping[str, np.ndarray], Mapping[str, object]]]
# (root, request JSON, identity JSON) -> (the verified entry, its files' stats then)
_VERIFIED: dict[tuple[str, str, str], tuple[Entry, dict[str, list[int]] | None]] = {}


def default_root() -> Path:
    """``$FEDHETERO_DATA_CACHE`` if set, else ``$XDG_CACHE_HOME/fedhetero/arrays`` (default
    ``~/.cache/fedhetero/arrays``)."""
    if os.environ.get(ROOT_ENV):
        return Path(os.environ[ROOT_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fedhetero" / "arrays"


def entry_name(request: Mapping[str, object]) -> str:
    """The folder name of the entry for ``request`` (sha256 of its canonical JSON)."""
    text = json.dumps({"format": FORMAT, **request}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:40]


@dataclass(frozen=True)
class Entry:
    """A verified cache entry: its arrays (memory-mapped copy-on-write) and metadata."""

    path: Path
    arrays: dict[str, np.ndarray]
    meta: dict


def file_stat(path: Path) -> list[int]:
    """What must not change for a verified file to stay trusted: inode, size, mtime, ctime."""
    st = path.stat()
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def sha256_of(path: Path) -> str:
    """The sha256 of a file's bytes, read in full."""
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


class ArrayCache:
    """Entries of named numpy arrays under ``root`` (module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def load(self, request: Mapping[str, object], identity: Mapping[str, object],
             build: Builder, what: str = "arrays") -> Entry:
        """The verified entry for ``request`` whose source has ``identity``; built by
        ``build() -> (arrays, meta)`` and written first when missing, stale or corrupt.

        ``what`` names the entry in log lines (e.g. "Fashion-MNIST, normalized").
        """
        request_text, identity_text = _canonical(request), _canonical(identity)
        known = (str(self.root), request_text, identity_text)
        if known in _VERIFIED:
            entry, stats = _VERIFIED[known]
            if _folder_stats(entry.path) == stats:
                return entry
            del _VERIFIED[known]
        request, identity = json.loads(request_text), json.loads(identity_text)
        name = entry_name(request)
        path = self.root / name
        self.root.mkdir(parents=True, exist_ok=True)
        with self._lock(name, exclusive=False):
            stats = _folder_stats(path)  # before the checks: a later change is noticed
            entry, problem = self._read(path, request, identity, rehash=False)
        if entry is None:
            with self._lock(name, exclusive=True):
                entry, problem = self._read(path, request, identity, rehash=True)
                if entry is None:  # not built by another process meanwhile, nor re-stat'ed
                    if problem != "missing":
                        LOGGER.warning("Data cache: rebuilding %s (%s): %s", path, what, problem)
                    arrays, meta = build()
                    self._write(path, request, identity, arrays, meta)
                    entry, problem = self._read(path, request, identity, rehash=True)
                stats = _folder_stats(path)  # the files as verified (re-stat'ed or written)
        if entry is None:
            raise RuntimeError(f"data cache entry {path} is unusable right after it was "
                               f"written ({problem}); check the disk, or delete {self.root}")
        _VERIFIED[known] = entry, stats
        return entry

    # ------------------------------------------------------------- reading
    def _read(self, path: Path, request: dict, identity: dict,
              rehash: bool) -> tuple[Entry | None, str]:
        """(entry, "") or (None, why not). Without ``rehash`` a file whose stat changed is
        reported as unverified; with it, its checksum decides (and the new stat is kept)."""
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except FileNotFoundError:
            return None, "missing"
        except (OSError, ValueError) as exc:
            return None, f"its manifest cannot be read ({exc})"
        if manifest.get("request") != request:
            return None, "its manifest belongs to another request"
        if manifest.get("identity") != identity:
            return None, ("stale: the source changed since it was written "
                          f"(then {manifest.get('identity')}, now {identity})")
        restated = False
        for key, info in manifest["arrays"].items():
            file = path / f"{key}.npy"
            try:
                stat = file_stat(file)
            except FileNotFoundError:
                return None, f"corrupt: {file.name} is missing"
            if stat[1] != info["bytes"]:
                return None, f"corrupt: {file.name} has {stat[1]} bytes, expected {info['bytes']}"
            if stat == info["stat"]:
                continue
            if not rehash:
                return None, f"{file.name} changed on disk since it was verified"
            if sha256_of(file) != info["sha256"]:
                return None, f"corrupt: the sha256 of {file.name} does not match its manifest"
            info["stat"], restated = file_stat(file), True
        arrays = {}
        for key, info in manifest["arrays"].items():
            try:
                array = np.load(path / f"{key}.npy", mmap_mode="c", allow_pickle=False)
            except (OSError, ValueError) as exc:
                return None, f"corrupt: {key}.npy cannot be mapped ({exc})"
            if list(array.shape) != info["shape"] or str(array.dtype) != info["dtype"]:
                return None, (f"corrupt: {key}.npy is {array.dtype}{list(array.shape)}, "
                              f"expected {info['dtype']}{info['shape']}")
            array.setflags(write=False)  # shared by every later load in this process
            arrays[key] = array
        if restated:  # verified in full again (e.g. a copied cache): trust the new stat
            _write_json(path / MANIFEST, manifest)
        return Entry(path, arrays, manifest["meta"]), ""

    # ------------------------------------------------------------- writing
    def _write(self, path: Path, request: dict, identity: dict,
               arrays: Mapping[str, np.ndarray], meta: Mapping[str, object]) -> None:
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=self.root))
        try:
            entries = {}
            for key, array in arrays.items():
                file = tmp / f"{key}.npy"
                with file.open("wb") as handle:
                    np.save(handle, np.ascontiguousarray(array), allow_pickle=False)
                    handle.flush()
                    os.fsync(handle.fileno())
                entries[key] = {"dtype": str(array.dtype), "shape": list(array.shape),
                                "bytes": file.stat().st_size, "sha256": sha256_of(file),
                                "stat": file_stat(file)}
            _write_json(tmp / MANIFEST, {"request": request, "identity": identity,
                                         "arrays": entries, "meta": _plain(meta)})
            _fsync_dir(tmp)
            if path.exists():  # stale or corrupt: out of the way first, then removed
                trash = Path(tempfile.mkdtemp(prefix=f".{path.name}.old.", dir=self.root))
                os.replace(path, trash / "entry")
                shutil.rmtree(trash, ignore_errors=True)
            os.rename(tmp, path)
            _fsync_dir(self.root)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    @contextmanager
    def _lock(self, name: str, exclusive: bool) -> Iterator[None]:
        with open(self.root / f"{name}.lock", "a+b") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def _canonical(value: Mapping[str, object]) -> str:
    """``value`` as canonical JSON (tuples become lists), so comparisons are exact."""
    return json.dumps(value, sort_keys=True)


def _plain(value: Mapping[str, object]) -> dict:
    """``value`` as JSON gives it back."""
    return json.loads(_canonical(value))


def _folder_stats(path: Path) -> dict[str, list[int]] | None:
    """The stat of every file in an entry's folder (None when the folder is gone)."""
    try:
        return {item.name: file_stat(Path(item.path)) for item in os.scandir(path)}
    except FileNotFoundError:
        return None


def _write_json(path: Path, payload: dict) -> None:
    """Atomically replace ``path`` with ``payload`` (temp file, fsync, rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w") as handle:
        json.dump(payload, handle, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
