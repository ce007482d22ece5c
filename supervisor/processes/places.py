"""What a job writes to disk: all of its scratch directory (its own, removed when it ends) and what its crew's HOME
and CrewAI storage (kept, and shared with the crew's other jobs) grew by since it started, in blocks the disk holds
(a sparse file's hole costs nothing).

Walking a directory tree takes time in proportion to its entries (a crew's caches may hold thousands), so each
reading is taken off the loop, at most every ``MEASURE_SECONDS``, and the limits judge the latest one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

MAX_NEW_ENTRIES = 10_000  # files and directories a job may add to its places: past it, too many to keep counting
MAX_WALK = 100_000  # entries one reading walks at most: a crew's place larger than that is counted only so far
MEASURE_SECONDS = 1.0


class Places:
    def __init__(self, scratch: Path, kept: tuple[Path, ...]) -> None:
        self.scratch = scratch
        self.kept = kept
        self.reading: tuple[int, int] | None = None  # (bytes written, entries added), as last measured
        self._baseline: tuple[int, int] | None = None  # the kept places when the job started: not its
        self._measuring: asyncio.Future[None] | None = None
        self._measured_at = float("-inf")

    def poll(self) -> tuple[int, int] | None:
        """The latest reading (None before the first); the next is started off the loop once its time has come."""
        loop = asyncio.get_running_loop()
        idle = self._measuring is None or self._measuring.done()
        if idle and loop.time() - self._measured_at >= MEASURE_SECONDS:
            self._measured_at = loop.time()
            self._measuring = loop.run_in_executor(None, self.measure)
        return self.reading

    def measure(self) -> None:
        """Take a reading now (the first one only notes what the crew's places held before the job)."""
        kept = disk_use(self.kept)
        if self._baseline is None:
            self._baseline = kept
            return
        scratch = disk_use((self.scratch,))
        grown = [max(now - before, 0) for now, before in zip(kept, self._baseline, strict=True)]
        self.reading = (scratch[0] + grown[0], scratch[1] + grown[1])


def disk_use(paths: Iterable[Path], entries: int = MAX_WALK) -> tuple[int, int]:
    """The bytes on disk beneath ``paths`` (links not followed) and how many entries were walked, ``entries`` at
    most."""
    used, walked, pending = 0, 0, [str(path) for path in paths]
    while pending and walked < entries:
        with contextlib.suppress(OSError), os.scandir(pending.pop()) as listing:
            for entry in listing:
                walked += 1
                if walked > entries:
                    break
                with contextlib.suppress(OSError):
                    used += entry.stat(follow_symlinks=False).st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
    return used, min(walked, entries)
