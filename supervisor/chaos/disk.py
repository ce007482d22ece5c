"""A small filesystem for a journal to fill: a size-limited tmpfs that root mounts, filled and freed on
demand, so a chaos run or a test can see what a full disk does to admission and to running jobs."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import time
from pathlib import Path

FILLER = ".filler"  # hidden, beside the state directory: never a journal path
CHUNK = 1 << 20
PAGE = 4096
EMPTY_SECONDS = 60.0  # how long the filler's space may take to come back once removed (16 s seen under load)


class DiskUnavailable(RuntimeError):
    """No small filesystem here (not root, or the kernel refused the mount), or its filler's space did not come back:
    one line says which."""


class SmallDisk:
    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def mount(cls, path: Path, size_mb: int) -> SmallDisk:
        """A tmpfs of ``size_mb`` at ``path`` (created 0700). Needs root (CAP_SYS_ADMIN)."""
        if os.geteuid() != 0:
            raise DiskUnavailable("mounting a small filesystem needs root")
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0700", "tmpfs", str(path)],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise DiskUnavailable(f"mount -t tmpfs refused: {result.stderr.strip() or result.returncode}")
        return cls(path)

    @property
    def free_bytes(self) -> int:
        info = os.statvfs(self.path)
        return info.f_bavail * info.f_frsize

    def fill(self, leave: int = 0) -> bool:
        """Write a filler file until at most ``leave`` bytes are free (0: until the kernel says ENOSPC);
        returns whether it said ENOSPC. Unbuffered, so nothing is left to fail at close."""
        with open(self.path / FILLER, "ab", buffering=0) as out:
            while (room := self.free_bytes - leave) > 0 or leave == 0:
                try:
                    out.write(b"\0" * max(min(CHUNK, room), PAGE))
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    return True
        return False

    def empty(self) -> None:
        """Remove the filler; returns once the space it held is free again.

        Not at once: under load the kernel has been seen to keep an unlinked filler's blocks for seconds (no
        process held it), and a supervisor restarted meanwhile found its disk full, as no run of ours leaves it.
        Half of it back is enough: nothing else can take that much so soon."""
        try:
            held = os.stat(self.path / FILLER).st_blocks * 512
        except FileNotFoundError:
            return
        (self.path / FILLER).unlink()
        deadline = time.monotonic() + EMPTY_SECONDS
        while self.free_bytes < held // 2:
            if time.monotonic() > deadline:
                raise DiskUnavailable(f"the disk fault's {held >> 20} MiB were not free {EMPTY_SECONDS:g} s after")
            time.sleep(0.01)

    def unmount(self) -> None:
        """Unmount (lazily if a process still holds a file there: it goes once they close)."""
        (self.path / FILLER).unlink(missing_ok=True)  # no wait for its space: the whole disk goes
        with contextlib.suppress(subprocess.CalledProcessError):
            subprocess.run(["umount", str(self.path)], check=True, capture_output=True)
            return
        subprocess.run(["umount", "-l", str(self.path)], check=False, capture_output=True)

    def __enter__(self) -> SmallDisk:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unmount()
