"""The test process's resident memory, watched while something runs in it."""

from __future__ import annotations

import os
import threading


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class RssWatch:
    """The highest resident set of this process (the coordinator) while it runs, sampled
    every 20 ms on a thread of its own; ``grew_mib``: that peak over the start."""

    def __init__(self) -> None:
        self.base = self.peak = rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss_bytes())

    @property
    def grew_mib(self) -> float:
        return (self.peak - self.base) / 2**20

    def __enter__(self) -> RssWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())
