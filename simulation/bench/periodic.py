"""A sampler that reads something every ``interval`` seconds on a background thread while a
``with`` block runs (the benches' CPU and memory samplers). Off Linux (no ``/proc``) it
samples nothing: ``available`` is False."""

from __future__ import annotations

import threading
from pathlib import Path


class PeriodicSampler:
    """Calls :meth:`sample` every ``interval`` seconds between ``__enter__`` and ``__exit__``."""

    def __init__(self, interval: float, name: str) -> None:
        self.interval = interval
        self.available = Path("/proc/self/stat").is_file()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name=name)

    def sample(self) -> None:
        """One reading (subclasses)."""
        raise NotImplementedError

    def __enter__(self):
        if self.available:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)
