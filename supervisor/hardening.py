"""What the supervisor narrows about itself at start, before it opens its state or starts any child.

Crews run as our uid unless WORKER_USER is set, and on a kernel without Landlock nothing else stands between
them and us (docs/security.md); these steps take away what costs nothing to take away: reading our memory and
environment through /proc or ptrace, the token in our environment, descriptors our launcher leaked to us, and a
descriptor limit far below what the kernel allows.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource

from supervisor.config import PREFIX

PR_SET_DUMPABLE = 4


def undumpable() -> None:
    """Not dumpable: /proc/<pid>/environ, mem, fd/ and ptrace (and so pidfd_getfd) are closed to processes
    of our uid without CAP_SYS_PTRACE, CAP_SYS_ADMIN or CAP_PERFMON: the workers (which drop every
    capability when root, worker/tether.py). The cost: no core dump of the supervisor."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")


def close_inherited_descriptors() -> None:
    """Every descriptor ≥ 3 our launcher left open becomes close-on-exec, so no child inherits it.

    Not closed: one may be something the launcher expects us to hold (a lock, a log), and we never
    use them ourselves. Python opens its own close-on-exec already (PEP 446).
    """
    for name in os.listdir("/proc/self/fd"):
        # The listing's own descriptor is gone by now: EBADF.
        with contextlib.suppress(OSError):
            if int(name) >= 3:
                os.set_inheritable(int(name), False)


def raise_open_files_limit() -> int:
    """The soft RLIMIT_NOFILE up to the hard one (containers often start at 1024 of 20000 or more);
    returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def forget_token() -> None:
    """Take ``AIP_CREWAI_BEARER_TOKEN`` out of our environment once the settings hold it.

    ``os.environ.pop`` alone only unlinks it from the C ``environ`` array: /proc/<pid>/environ shows the
    block the kernel wrote at exec, so the value is zeroed there first, in place.
    """
    name = f"{PREFIX}BEARER_TOKEN=".encode()
    libc = ctypes.CDLL(None)
    entries = ctypes.POINTER(ctypes.c_void_p).in_dll(libc, "environ")
    index = 0
    while entries[index]:
        address = entries[index]
        entry = ctypes.string_at(address)
        if entry.startswith(name):
            ctypes.memset(address + len(name), 0, len(entry) - len(name))
        index += 1
    os.environ.pop(f"{PREFIX}BEARER_TOKEN", None)
