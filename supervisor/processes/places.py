"""What a job has on disk: all of its scratch directory (its own, removed when it ends), what its crew's HOME and
CrewAI storage (kept, and shared with the crew's other jobs) grew by since it started, in blocks the disk holds (a
sparse file's hole costs nothing), and the files with no name its processes hold open (``held.py``). Also how large
the crew's places are, whole: what ``CREW_MAX_DISK_MB`` bounds.

Walking a directory tree takes time in proportion to its entries (a crew's caches may hold thousands), so each
reading is taken off the loop, the places walked at most every ``MEASURE_SECONDS``, the descriptors of the job's
processes read at each sample; the limits judge the latest reading. A final one is taken once the job's processes
are gone (``measure``): what it left counts then.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from supervisor.processes.held import unnamed_files

MAX_NEW_ENTRIES = 10_000  # files and directories a job may add to its places: past it, too many to keep counting
MAX_WALK = 100_000  # entries one reading walks at most: a crew's place larger than that is counted only so far
MEASURE_SECONDS = 1.0


@dataclasses.dataclass(frozen=True)
class Reading:
    """What a job has on disk, as last measured."""

    written: int = 0  # bytes in its places: its scratch directory whole, its crew's by what they grew
    entries: int = 0  # files and directories it added there
    held: int = 0  # bytes in files with no name that its processes hold open, each counted once
    held_files: int = 0
    crew: int = 0  # bytes in its crew's HOME and storage, whole: every job's of the crew, before and now
    unreadable: tuple[int, ...] = ()  # its processes whose descriptors the supervisor may not read

    @property
    def disk_bytes(self) -> int:
        """What the job's disk cap counts: what it wrote to its places and what it holds with no name."""
        return self.written + self.held


class Places:
    def __init__(self, scratch: Path, kept: tuple[Path, ...]) -> None:
        self.scratch = scratch
        self.kept = kept
        self.reading: Reading | None = None  # the latest, None before the first
        self._baseline: tuple[int, int] | None = None  # the kept places when the job started: not its
        self._walked = Reading()  # the places' part of the latest reading
        self._measuring: asyncio.Future[Reading] | None = None
        self._walked_at = float("-inf")

    def begin(self) -> int:
        """Note what the crew's places hold before the job starts (only what they grow by is the job's); their
        bytes. Off the loop."""
        self._baseline = disk_use(self.kept)
        return self._baseline[0]

    def poll(self, pids: Sequence[int]) -> Reading | None:
        """The latest reading; the next is started off the loop once the last is done: the descriptors of ``pids``
        (the job's processes) read each time, the places walked again once ``MEASURE_SECONDS`` have passed."""
        loop = asyncio.get_running_loop()
        if self._measuring is None or self._measuring.done():
            walk = loop.time() - self._walked_at >= MEASURE_SECONDS
            if walk:
                self._walked_at = loop.time()
            self._measuring = loop.run_in_executor(None, self.measure, tuple(pids), walk)
        return self.reading

    def measure(self, pids: Sequence[int] = (), walk: bool = True) -> Reading:
        """Take a reading now: what ``pids`` hold with no name, and the places as last walked (``walk``: now). The
        first walk before ``begin`` notes what the crew's places held as theirs."""
        if walk:
            kept = disk_use(self.kept)
            if self._baseline is None:
                self._baseline = kept
            scratch = disk_use((self.scratch,))
            grown = [max(now - before, 0) for now, before in zip(kept, self._baseline, strict=True)]
            self._walked = Reading(scratch[0] + grown[0], scratch[1] + grown[1], crew=kept[0])
        held, files, unreadable = unnamed_files(pids)
        self.reading = dataclasses.replace(self._walked, held=held, held_files=files, unreadable=unreadable)
        return self.reading


def disk_use(paths: Iterable[Path], entries: int = MAX_WALK) -> tuple[int, int]:
    """The bytes on disk beneath ``paths`` (links not followed; a file with several names counted once) and how
    many entries were walked, ``entries`` at most."""
    used, walked, pending = 0, 0, [str(path) for path in paths]
    linked: set[tuple[int, int]] = set()
    while pending and walked < entries:
        with contextlib.suppress(OSError), os.scandir(pending.pop()) as listing:
            for entry in listing:
                walked += 1
                if walked > entries:
                    break
                with contextlib.suppress(OSError):
                    found = entry.stat(follow_symlinks=False)
                    if found.st_nlink > 1 and not entry.is_dir(follow_symlinks=False):
                        if (found.st_dev, found.st_ino) in linked:
                            continue
                        linked.add((found.st_dev, found.st_ino))
                    used += found.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
    return used, min(walked, entries)
