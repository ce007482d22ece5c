"""Copying ahead the pages a job will write, so a forked worker does not fault them in one by one.

A worker forked from the fork server shares its memory copy-on-write. Its first kickoff then writes
(mostly reference counts) to about 4,900 shared pages, and each write faults: ~5 µs a page on this kind
of VM, 25-40 ms of system time per job, on the start's path. The fork server learns once, at start,
which pages that are: a probe child runs one more warm-up kickoff and reads its own page map for the
pages it now holds alone. Each worker copies those pages up front with ``madvise(MADV_POPULATE_WRITE)``,
one call per run of pages, before it waits for its job; a pre-forked worker does so while idle, off
the start's path. The copies cost what the faults would have; they are just taken earlier.

Best effort throughout: without a readable page map (a sandbox), without MADV_POPULATE_WRITE (Linux
before 5.14), or for a run no longer mapped, the job simply takes its faults itself.
"""

from __future__ import annotations

import array
import ctypes
import os
import selectors
import signal
import time
from collections.abc import Callable
from typing import TypeAlias

from worker import tether

PAGE = os.sysconf("SC_PAGE_SIZE")
MADV_POPULATE_WRITE = 23  # linux/mman.h, Linux 5.14+
PRESENT = 1 << 63  # /proc/<pid>/pagemap entry bits (Documentation/admin-guide/mm/pagemap.rst)
EXCLUSIVE = 1 << 56  # the page is mapped only here: for a forked child, copied on write (or new)
FILE = 1 << 61  # a file page (read, never written) or shared anonymous memory: nothing to copy
MAX_RUNS = 65_536  # 1 MiB of (address, length) pairs; a probe reporting more is ignored
PROBE_SECONDS = 60.0

Runs: TypeAlias = "array.array[int]"  # of unsigned 64-bit (address, length) pairs


def probe(kickoff: Callable[[], object]) -> Runs:
    """The pages ``kickoff`` writes in a forked child, as runs; empty if they cannot be learned.

    Called in the fork server while it is single-threaded, as for any fork.
    """
    read, write = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the probe: never returns
        os.close(read)
        status = 1
        try:
            tether.bind_to_parent(parent)
            # An undumpable process's /proc files are root's: its own page map (0400) is then unreadable to
            # any other uid. The probe holds nothing a worker will not hold too, and exits after.
            tether.set_dumpable(True)
            mapped = _private_writable()
            kickoff()
            runs = _written(mapped)
            if len(runs) <= 2 * MAX_RUNS:
                _write_all(write, runs.tobytes())
                status = 0
        finally:
            os._exit(status)
    os.close(write)
    try:
        data = _read_all(read, PROBE_SECONDS)
    finally:
        os.close(read)
        _reap(pid)
    runs = array.array("Q")
    if data is not None and len(data) % (2 * runs.itemsize) == 0:
        runs.frombytes(data)
    return runs


def populate(runs: Runs) -> None:
    """Copy ``runs`` into this process now (each write-faulted once, in bulk)."""
    if not runs:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for i in range(0, len(runs), 2):
        # A run that fails (ENOMEM: no longer mapped; EINVAL: an old kernel, or a mapping it refuses) is
        # skipped: its pages fault in lazily, as without this module.
        libc.madvise(runs[i], runs[i + 1], MADV_POPULATE_WRITE)


def _private_writable() -> list[tuple[int, int]]:
    """This process's private writable mappings: where copy-on-write happens. The kernel's own
    ``[vvar]``-style regions are left out."""
    found = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            name = fields[5] if len(fields) > 5 else ""
            if fields[1].startswith("rw") and fields[1][3] == "p" and not name.startswith("[v"):
                start, end = (int(bound, 16) for bound in fields[0].split("-"))
                found.append((start, end))
    return found


def _written(mapped: list[tuple[int, int]]) -> Runs:
    """Runs of anonymous pages in ``mapped`` present and held by this process alone."""
    runs = array.array("Q")
    entry = array.array("Q")
    with open("/proc/self/pagemap", "rb", buffering=0) as pagemap:
        for start, end in mapped:
            pagemap.seek(start // PAGE * entry.itemsize)
            entries = array.array("Q", pagemap.read((end - start) // PAGE * entry.itemsize))
            first = None
            for index, bits in enumerate(entries):
                held = bits & PRESENT and bits & EXCLUSIVE and not bits & FILE
                if held and first is None:
                    first = index
                elif not held and first is not None:
                    runs.extend((start + first * PAGE, (index - first) * PAGE))
                    first = None
            if first is not None:
                runs.extend((start + first * PAGE, (len(entries) - first) * PAGE))
    return runs


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_all(fd: int, timeout: float) -> bytes | None:
    """Everything until EOF, or None past ``timeout`` or ``MAX_RUNS``."""
    deadline = time.monotonic() + timeout
    chunks: list[bytes] = []
    size = 0
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not selector.select(remaining):
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
            if size > 2 * MAX_RUNS * 8:
                return None


def _reap(pid: int) -> None:
    """The probe has answered (or failed to): make sure it is gone and reaped. Not reaped yet, so the pid
    is still its own, even if it has exited."""
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
