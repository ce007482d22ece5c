"""A stand-in deployment for ``crew-supervisor chaos --url``: a supervisor on a fixed port and token, and
the restart command an operator would give (SIGKILL it, start it again on the same state). With
``--lose-journal`` the restart starts on an empty state, as a pod on an ``emptyDir`` volume would: a
broken deployment that chaos must catch.

    python -m tests.helpers.deployment start DIR PORT        # writes DIR/token and DIR/pid
    python -m tests.helpers.deployment restart DIR PORT [--lose-journal]
    python -m tests.helpers.deployment kill DIR
"""

from __future__ import annotations

import argparse
import secrets
import shutil
import signal
import sys
from pathlib import Path

import psutil

from supervisor import testing
from supervisor.chaos.faults import dead


def start(directory: Path, port: int) -> None:
    token = (directory / "token").read_text().strip()
    server = testing.start(
        directory / "state",
        "worker.demo:registry",
        port=port,
        token=token,
        log=directory / "supervisor.log",
        max_retained_runs=100000,
        min_free_disk_mb=1,
        warmup="offline",  # chaos runs its offline crews only: as the suite's supervisors (tests/conftest.py SETTINGS)
    )
    (directory / "pid").write_text(str(server.pid))  # it outlives this script, as a service would


def kill(directory: Path) -> None:
    pid = int((directory / "pid").read_text())
    try:
        process = psutil.Process(pid)
        process.send_signal(signal.SIGKILL)
    except psutil.NoSuchProcess:
        return
    if not dead(process):
        sys.exit(f"supervisor {pid} outlived SIGKILL")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("action", choices=["start", "restart", "kill"])
    parser.add_argument("directory", type=Path)
    parser.add_argument("port", type=int, nargs="?", default=0)
    parser.add_argument("--lose-journal", action="store_true")
    args = parser.parse_args()
    if args.action == "start":
        args.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        (args.directory / "token").write_text(secrets.token_urlsafe(16))
        (args.directory / "token").chmod(0o600)
        start(args.directory, args.port)
        return
    kill(args.directory)
    if args.action == "restart":
        if args.lose_journal:
            shutil.rmtree(args.directory / "state")
        start(args.directory, args.port)


if __name__ == "__main__":
    main()
