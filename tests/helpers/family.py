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

import errno
import glob
import os
import subprocess
import sys
import time

import psutil

ROLES = ("child", "setsid", "escaper", "mover")


def escape() -> str:
    """Try every root cgroup: ``denied:EACCES,...`` when none took the pid, else ``joined:<files>``."""
    joined, refused = [], set()
    for procs in sorted({*glob.glob("/sys/fs/cgroup/*/cgroup.procs"), "/sys/fs/cgroup/cgroup.procs"}):
        try:
            with open(procs, "w") as file:
                file.write(str(os.getpid()))
            joined.append(procs)
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
