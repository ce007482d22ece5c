"""Files a job's processes hold open that have no name: made with ``O_TMPFILE``, or unlinked while open. No walk of
names finds one, yet it takes disk until its last descriptor closes, and its holder may give it a name at any time
(``linkat`` through ``/proc/self/fd``). Each is found through a descriptor in ``/proc/<pid>/fd`` and counted once,
by device and inode, however many descriptors and processes hold it (a fork inherits them all).

A memfd is left out: it is memory (shmem, charged to the job's memory cgroup), not disk. A file with no name that
is only mapped, its descriptors closed, is not found here (``/proc/<pid>/map_files`` would; see docs/security.md).
"""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Iterable

import psutil

DELETED = " (deleted)"  # how the kernel ends the link of a descriptor whose file has no name left
MEMFD = "/memfd:"
# Descriptors one scan reads at most (a readlink each): a job may hold WORKER_MAX_PROCESSES x WORKER_MAX_OPEN_FILES.
# Past it, too many to keep counting: the job's disk cap stops it (as past MAX_NEW_ENTRIES files).
MAX_DESCRIPTORS = 8192


@dataclasses.dataclass(frozen=True)
class Held:
    """What one scan found the job's processes hold with no name."""

    bytes: int = 0  # on disk, in blocks (a sparse file's hole costs nothing), each file once
    files: int = 0
    hidden: tuple[int, ...] = ()  # the job's processes whose descriptors the supervisor may not read
    descriptors: int = 0  # read; past MAX_DESCRIPTORS the scan stopped


def unnamed_files(processes: Iterable[psutil.Process], most: int = MAX_DESCRIPTORS) -> Held:
    """What the files with no name that ``processes`` (the job's, as a sample saw them) hold open. A process that
    made itself not dumpable hides its descriptors from a supervisor without CAP_SYS_PTRACE (the container's, which
    shares the workers' uid): named in ``hidden``. A process gone, or a descriptor closed, meanwhile is skipped; so
    is a pid another process took since the sample (its start time differs): nothing another holds is the job's.

    One ``readlink`` per descriptor, ``most`` in all (then ``descriptors`` is past it), and a ``stat`` only for those
    whose file has no name left."""
    files: dict[tuple[int, int], int] = {}
    hidden: list[int] = []
    read = 0
    for process in processes:
        if read > most:
            break
        found, refused, read = _held_by(process.pid, read, most)
        if not process.is_running():  # its pid is another's now: what the reads found may be that one's
            continue
        if refused:
            hidden.append(process.pid)
        files.update(found)
    return Held(sum(files.values()), len(files), tuple(hidden), read)


def _held_by(pid: int, read: int, most: int) -> tuple[dict[tuple[int, int], int], bool, int]:
    """The files with no name ``pid`` holds (bytes by device and inode), whether it refused its descriptors, and the
    descriptors read so far (``read`` before it; it stops past ``most``)."""
    where = f"/proc/{pid}/fd/"
    files: dict[tuple[int, int], int] = {}
    try:
        descriptors = os.listdir(where)
    except PermissionError:
        return files, True, read
    except OSError:
        return files, False, read
    for fd in descriptors:
        read += 1
        if read > most:
            break
        try:
            target = os.readlink(where + fd)  # refused where its listing was not: a root supervisor without caps
            if not target.endswith(DELETED) or target.startswith(MEMFD):
                continue
            held = os.stat(where + fd)  # through the descriptor: the file itself, whatever its name was
        except PermissionError:
            return files, True, read
        except OSError:
            continue
        if held.st_nlink == 0 and stat.S_ISREG(held.st_mode):  # "(deleted)" may be a name's own last word
            files[(held.st_dev, held.st_ino)] = held.st_blocks * 512
    return files, False, read
