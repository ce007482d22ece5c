"""What a job has on disk: all of its scratch directory (its own, removed when it ends), what its crew's HOME and
CrewAI storage (kept, and shared with the crew's other jobs) grew by since it started, in blocks the disk holds (a
sparse file's hole costs nothing), and the files with no name its processes hold open (``held.py``; read only where
the job's own cap counts them). Also how large the crew's places are, whole: what ``CREW_MAX_DISK_MB`` bounds.

Walking a directory tree takes time in proportion to its entries (a crew's caches may hold thousands), so each
reading is taken off the loop, at most every ``MEASURE_SECONDS`` (the places walked and the job's descriptors read
together); the limits judge the latest reading. The first is taken as the job starts, concurrently with its
worker's launch (``begin``); a final one once the job's processes are gone (``measure``): what it left counts then.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import psutil

from supervisor.processes.held import unnamed_files

MAX_NEW_ENTRIES = 10_000  # files and directories a job may add to its places: past it, too many to keep counting
MAX_WALK = 100_000  # entries one reading walks at most: a crew's place larger than that is counted only so far
MEASURE_SECONDS = 1.0
MAX_HIDDEN = 32  # processes of a job that hid their descriptors, named at most


@dataclasses.dataclass(frozen=True)
class Reading:
    """What a job has on disk, as last measured."""

    written: int = 0  # bytes in its places: its scratch directory whole, its crew's by what they grew
    entries: int = 0  # files and directories it added there
    held: int = 0  # bytes in files with no name that its processes hold open, each counted once
    held_files: int = 0
    crew: int = 0  # bytes in its crew's HOME and storage, whole: every job's of the crew, before and now
    grew: int = 0  # bytes its crew's HOME and storage grew by while it ran (by any job of the crew)
    descriptors: int = 0  # its processes' descriptors the last scan read (past MAX_DESCRIPTORS it stopped)
    unreadable: tuple[int, ...] = ()  # its processes that hid their descriptors, at any reading (MAX_HIDDEN named)

    @property
    def disk_bytes(self) -> int:
        """What the job's disk cap counts: what it wrote to its places and what it holds with no name."""
        return self.written + self.held


class Places:
    def __init__(self, scratch: Path, kept: tuple[Path, ...], held: bool = True) -> None:
        self.scratch = scratch
        self.kept = kept
        self.held = held  # whether the files with no name its processes hold are read (the job's own cap counts them)
        self.reading: Reading | None = None  # the latest, None before the first
        self._baseline: tuple[int, int] | None = None  # the kept places when the job started: not its
        self._hidden: dict[int, None] = {}  # its processes that hid their descriptors, in the order found
        self._measuring: asyncio.Future[Reading] | None = None
        self._measured_at = float("-inf")  # time.monotonic()

    async def begin(self) -> int:
        """Note, off the loop, what the crew's places hold before the job starts (only what they grow by is the
        job's); their bytes. It counts as the job's first reading: the next is taken ``MEASURE_SECONDS`` later."""
        return await asyncio.to_thread(self._begin)

    def _begin(self) -> int:
        self._baseline = disk_use(self.kept)
        self._measured_at = time.monotonic()
        return self._baseline[0]

    def poll(self, processes: Sequence[psutil.Process]) -> Reading | None:
        """The latest reading; the next is started off the loop once the last is done and ``MEASURE_SECONDS`` have
        passed since it began (``processes``: the job's, whose descriptors it reads)."""
        idle = self._measuring is None or self._measuring.done()
        if idle and time.monotonic() - self._measured_at >= MEASURE_SECONDS:
            self._measured_at = time.monotonic()
            self._measuring = asyncio.get_running_loop().run_in_executor(None, self.measure, tuple(processes))
        return self.reading

    def measure(self, processes: Sequence[psutil.Process] = ()) -> Reading:
        """Take a reading now: the places walked, and what ``processes`` hold with no name. The first walk before
        ``begin`` notes what the crew's places held as theirs."""
        kept = disk_use(self.kept)
        if self._baseline is None:
            self._baseline = kept
        scratch = disk_use((self.scratch,))
        grown = [max(now - before, 0) for now, before in zip(kept, self._baseline, strict=True)]
        held = unnamed_files(processes if self.held else ())
        for pid in held.hidden[: max(MAX_HIDDEN - len(self._hidden), 0)]:
            self._hidden[pid] = None
        self.reading = Reading(
            written=scratch[0] + grown[0],
            entries=scratch[1] + grown[1],
            held=held.bytes,
            held_files=held.files,
            crew=kept[0],
            grew=grown[0],
            descriptors=held.descriptors,
            unreadable=tuple(self._hidden),
        )
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
