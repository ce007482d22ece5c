"""A pids cgroup per worker, where the kernel lets us make one.

Sampling sees a fork bomb only after the fact; a cgroup's ``pids.max`` makes the kernel refuse the
fork itself, and its member list names every process of the job, even one that left with setsid.
RLIMIT_NPROC cannot do this: it counts all processes of the user (the supervisor and every other
job too), and root ignores it. Without a writable pids hierarchy (an unprivileged container) the
supervisor falls back to sampling, and the container's own pids limit is the hard cap.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

log = logging.getLogger("crew_supervisor.cgroups")
CGROUP_ROOT = Path("/sys/fs/cgroup")


class PidsCgroup:
    """One job's cgroup: a process cap, a member list, and whether the cap refused a fork."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def pids(self) -> list[int]:
        try:
            return [int(line) for line in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def refused_forks(self) -> int:
        """How many forks ``pids.max`` refused (the ``max`` line of ``pids.events``)."""
        with contextlib.suppress(OSError, ValueError):
            for line in (self.path / "pids.events").read_text().splitlines():
                name, _, count = line.partition(" ")
                if name == "max":
                    return int(count)
        return 0

    def remove(self) -> None:
        """Only an empty cgroup can go; reaped processes leave it at once."""
        with contextlib.suppress(OSError):
            self.path.rmdir()


class PidsCgroups:
    """The supervisor's own directory of job cgroups, under its pids cgroup."""

    def __init__(self, base: Path) -> None:
        self.base = base

    @classmethod
    def find(cls, root: Path = CGROUP_ROOT) -> PidsCgroups | None:
        """Our directory, made now; None if the pids controller is missing or not ours to write."""
        for candidate in _own_pids_directories(root):
            base = candidate / f"crew-supervisor-{os.getpid()}"
            try:
                base.mkdir(mode=0o755, exist_ok=True)
            except OSError:
                continue
            if (base / "pids.max").exists():
                _remove_stale(candidate)
                return cls(base)
            with contextlib.suppress(OSError):
                base.rmdir()
        return None

    def join(self, name: str, pid: int, limit: int) -> PidsCgroup | None:
        """Move ``pid`` (not yet running job code) into a new cgroup capped at ``limit`` processes."""
        path = self.base / name
        try:
            path.mkdir(mode=0o755)
            (path / "pids.max").write_text(str(limit))
            (path / "cgroup.procs").write_text(str(pid))
        except OSError as exc:
            log.warning("no pids cgroup for a worker: %s", exc.strerror)
            with contextlib.suppress(OSError):
                path.rmdir()
            return None
        return PidsCgroup(path)

    def remove(self) -> None:
        for child in self.base.iterdir() if self.base.exists() else ():
            if child.is_dir():
                PidsCgroup(child).remove()
        with contextlib.suppress(OSError):
            self.base.rmdir()


def _own_pids_directories(root: Path) -> list[Path]:
    """Where our pids cgroup lives: cgroup v1 (a ``pids`` hierarchy) first, then the v2 unified tree."""
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            relative = path.lstrip("/")
            if "pids" in controllers.split(","):
                found.append(root / "pids" / relative)
            elif controllers == "":
                found.extend([root / relative, root / "unified" / relative])
    return [path for path in found if path.is_dir()]


def _remove_stale(directory: Path) -> None:
    """Empty directories left by supervisors that died without cleaning up."""
    for child in directory.glob("crew-supervisor-*"):
        pid = child.name.rpartition("-")[2]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            for job in child.iterdir():
                if job.is_dir():
                    PidsCgroup(job).remove()
            with contextlib.suppress(OSError):
                child.rmdir()
