"""Forking a child of our own parent (``clone`` with ``CLONE_PARENT``): a fork server's worker is the supervisor's
child from its first instruction, with no middle process to fork it and exit.

A middle process costs a second copy of the fork server's page tables (~200 MB mapped) and their teardown when it
exits: ~16 ms of CPU a job (docs/benchmarks.md, issue 46). Python has no ``clone``, so the system call is made here,
with the GIL held throughout and the interpreter's own fork hooks around it (``PyOS_BeforeFork`` and the rest, as
``os.fork`` calls them): the child reinitialises its locks and threads and runs the ``os.register_at_fork`` hooks.
Only a single-threaded process may call it (the fork server checks before every fork): the C library's own fork
handlers do not run, which is safe only where no other thread can hold one of its locks.
"""

from __future__ import annotations

import ctypes
import os
import platform
import signal

CLONE_PARENT = 0x00008000
# clone's number where its first argument is the flags and the rest may be zero (no new stack: a fork's copy).
SYS_CLONE = {"x86_64": 56, "aarch64": 220}.get(platform.machine())
_libc = ctypes.PyDLL(None, use_errno=True)  # PyDLL: the call keeps the GIL, as os.fork does
_libc.syscall.restype = ctypes.c_long
_python = ctypes.pythonapi


def supported() -> bool:
    return SYS_CLONE is not None


def alone() -> bool:
    """Whether this process has one thread, by the kernel's count. The fork server's Python threads are checked
    before every fork; a native one (a library's pool, started at import) may hold a lock of the C library, which
    only the C library's own fork takes before it forks."""
    return len(os.listdir("/proc/self/task")) == 1


def fork_beside() -> int:
    """``os.fork``, but the child's parent is ours: 0 in the child, its pid in the parent. OSError if it failed."""
    if SYS_CLONE is None:
        raise OSError(f"no clone system call known on {platform.machine()}")
    _python.PyOS_BeforeFork()
    pid = _libc.syscall(ctypes.c_long(SYS_CLONE), ctypes.c_long(CLONE_PARENT | signal.SIGCHLD), *[ctypes.c_long(0)] * 4)
    if pid == 0:
        _python.PyOS_AfterFork_Child()
        return 0
    error = ctypes.get_errno()
    _python.PyOS_AfterFork_Parent()
    if pid < 0:
        raise OSError(error, os.strerror(error))
    return int(pid)  # ctypes gives the restype's Python int, typed Any
