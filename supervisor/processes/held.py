"""Files a job's processes hold open that have no name: made with ``O_TMPFILE``, or unlinked while open. No walk of
names finds one, yet it takes disk until its last descriptor closes, and its holder may give it a name at any time
(``linkat`` through ``/proc/self/fd``). Each is found through a descriptor in ``/proc/<pid>/fd`` and counted once,
by device and inode, however many descriptors and processes hold it (a fork inherits them all).

A memfd is left out: it is memory (shmem, charged to the job's memory cgroup), not disk. A file with no name that
is only mapped, its descriptors closed, is not found here (``/proc/<pid>/map_files`` would; see docs/security.md).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable

DELETED = " (deleted)"  # how the kernel ends the link of a descriptor whose file has no name left
MEMFD = "/memfd:"


def unnamed_files(pids: Iterable[int]) -> tuple[int, int, tuple[int, ...]]:
    """The bytes on disk (in blocks: a sparse file's hole costs nothing) of the files with no name that ``pids``
    hold open, how many they are, and the pids whose descriptors the supervisor may not read: a process that made
    itself not dumpable hides them from a supervisor without CAP_SYS_PTRACE (the container's, which shares the
    workers' uid). A process gone, or a descriptor closed, meanwhile is skipped.

    One ``readlink`` per descriptor, and a ``stat`` only for those whose file has no name left; a process's
    descriptors are bounded by its RLIMIT_NOFILE (``WORKER_MAX_OPEN_FILES``)."""
    files: dict[tuple[int, int], int] = {}
    unreadable = []
    for pid in pids:
        where = f"/proc/{pid}/fd/"
        try:
            descriptors = os.listdir(where)
        except PermissionError:
            unreadable.append(pid)
            continue
        except OSError:
            continue
        for fd in descriptors:
            try:
                target = os.readlink(where + fd)  # refused where its listing was not: a root supervisor without caps
                if not target.endswith(DELETED) or target.startswith(MEMFD):
                    continue
                held = os.stat(where + fd)  # through the descriptor: the file itself, whatever its name was
            except PermissionError:
                unreadable.append(pid)
                break
            except OSError:
                continue
            if held.st_nlink == 0 and stat.S_ISREG(held.st_mode):  # "(deleted)" may be a name's own last word
                files[(held.st_dev, held.st_ino)] = held.st_blocks * 512
    return sum(files.values()), len(files), tuple(unreadable)
