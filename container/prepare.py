#!/usr/bin/env python3
"""Kubernetes init step: put the bearer token where the supervisor accepts it, and make the state directories.

Installed in the image as /usr/local/bin/crew-supervisor-prepare; the StatefulSet runs it as an init container.

Why the token is copied rather than read from the Secret volume directly:
- a Secret volume presents each key as a symlink (``token -> ..data/token``) and the supervisor opens the token
  file with O_NOFOLLOW, so it refuses it;
- with a pod ``fsGroup`` (needed so uid 10001 can write the state volume) the kubelet ORs group-read into the
  Secret's ``defaultMode`` (kubernetes/kubernetes#57923: 0400 becomes 0440), and the supervisor refuses a token
  file with any group or other bit.
So the token is written, atomically, as a regular 0400 file into a memory-backed emptyDir.

usage: crew-supervisor-prepare [--token SOURCE DEST] [--directory DIR ...]
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from pathlib import Path

MAX_TOKEN_BYTES = 16384 + 2  # the supervisor's own limit, plus a line end


def copy_token(source: Path, dest: Path) -> None:
    data = source.read_bytes()  # follows the Secret volume's symlinks, on purpose
    if not data.strip() or len(data) > MAX_TOKEN_BYTES:
        raise SystemExit(f"crew-supervisor-prepare: {source} is empty or larger than {MAX_TOKEN_BYTES} bytes")
    temporary = dest.with_name(f".{dest.name}.{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o400)
    try:
        os.fchmod(fd, 0o400)  # whatever the umask or a setgid directory says
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, dest)  # a restarted pod keeps its emptyDir: replace, never append


def private_directory(path: Path) -> None:
    """A real directory of ours, mode 0700, as the supervisor requires for its state and training directories."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise SystemExit(f"crew-supervisor-prepare: {path} must be a directory, not a symlink")
    if info.st_mode & 0o077:
        os.chmod(path, 0o700)  # e.g. a setgid, group-writable directory left by the kubelet's fsGroup pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="crew-supervisor-prepare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--token", nargs=2, type=Path, metavar=("SOURCE", "DEST"), help="copy the token file")
    parser.add_argument("--directory", action="append", type=Path, default=[], help="make a 0700 directory")
    args = parser.parse_args(argv)
    for directory in args.directory:
        private_directory(directory)
    if args.token:
        copy_token(*args.token)
    return 0


if __name__ == "__main__":
    sys.exit(main())
