"""``python -m tests.helpers.family EVIDENCE ROLE``: one member of a job's family of processes, each a way a job's
process might outlive it (as an MCP stdio server or a code interpreter is a child of a job's worker).

- ``child``: stays in the worker's group, and starts the two grandchildren below;
- ``setsid``: a grandchild that leaves the group and the session;
- ``escaper``: a grandchild that tries to leave the job's cgroups, writing its pid into every root cgroup's
  ``cgroup.procs`` (a uid 0 without capabilities passes the owner check on those files);
- ``mover``: a child that moves to a process group of its own.

Each appends ``ROLE PID START_TIME [RESULT]`` to EVIDENCE once it is what it says (the escaper's result: ``denied``
with the errno names, or ``joined`` with the files it wrote into), then sleeps for an hour.
"""

from __future__ import annotations

import ctypes
import errno
import glob
import os
import signal
import struct
import subprocess
import sys
import time

import psutil

from tests.helpers.attacks import child_by_call

ROLES = ("child", "setsid", "escaper", "mover")


CLONE_INTO_CGROUP, CLONE3 = 0x200000000, 435


def clone_into(cgroup: str) -> None:
    """Start a child straight into the cgroup v2 directory ``cgroup`` (``clone3`` with CLONE_INTO_CGROUP), which
    needs only to open it: the child exits at once. Raises OSError as the kernel refuses."""
    fd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
    try:
        # struct clone_args: flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid,
        # set_tid_size, cgroup: eleven 64-bit fields.
        fields = (CLONE_INTO_CGROUP, 0, 0, 0, signal.SIGCHLD, 0, 0, 0, 0, 0, fd)
        args = ctypes.create_string_buffer(struct.pack("=11Q", *fields), 88)
        child_by_call(CLONE3, args, ctypes.c_size_t(len(args.raw)))
    finally:
        os.close(fd)


def escape() -> str:
    """Try every root cgroup, by writing this pid into it and by starting a child into a v2 one: ``denied:`` with
    the errno names when none let it in, else ``joined:`` with what did."""
    joined, refused = [], set()
    for procs in sorted({*glob.glob("/sys/fs/cgroup/*/cgroup.procs"), "/sys/fs/cgroup/cgroup.procs"}):
        try:
            with open(procs, "w") as file:
                file.write(str(os.getpid()))
            joined.append(procs)
        except OSError as exc:
            refused.add(errno.errorcode.get(exc.errno or 0, str(exc.errno)))
    for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        if os.path.exists(f"{root}/cgroup.controllers"):  # a v2 hierarchy
            try:
                clone_into(root)
                joined.append(f"clone3:{root}")
            except OSError as exc:
                refused.add(errno.errorcode.get(exc.errno or 0, str(exc.errno)))
    return f"joined:{','.join(joined)}" if joined else f"denied:{','.join(sorted(refused))}"


def main(evidence: str, role: str) -> None:
    result = ""
    if role == "child":
        for grandchild in ("setsid", "escaper"):
            subprocess.Popen([sys.executable, "-m", "tests.helpers.family", evidence, grandchild])
    elif role == "setsid":
        os.setsid()
    elif role == "mover":
        os.setpgid(0, 0)
    elif role == "escaper":
        result = escape()
    with open(evidence, "a") as file:
        file.write(f"{role} {os.getpid()} {psutil.Process().create_time()} {result}".rstrip() + "\n")
    time.sleep(3600)


if __name__ == "__main__":
    main(*sys.argv[1:3])
