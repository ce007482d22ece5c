"""``python -m worker job|describe|forkserver``: the processes the supervisor launches.

A job or describing worker finds its control pipe on fd 3 and its event pipe on fd 4; the fork
server finds its socket on fd 3.
"""

from __future__ import annotations

import argparse
import os
import sys

from protocol import CONTROL_FD, EVENT_FD
from worker import forkserver, job, lifecycle

NICE = "AIP_CREWAI_WORKER_NICE"  # set by the supervisor from its settings


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m worker")
    parser.add_argument("mode", choices=["job", "describe", "forkserver"])
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--cwd", help="working directory (the job's scratch directory)")
    args = parser.parse_args(argv)
    lifecycle.bind_to_parent(args.parent_pid)
    lifecycle.confine()
    # Before any thread exists, so all inherit it; a fork server's workers inherit it from the fork server.
    os.nice(int(os.environ.get(NICE, "0")))
    if args.cwd:
        os.chdir(args.cwd)
    if args.mode == "forkserver":
        forkserver.serve(CONTROL_FD)
    job.run(EVENT_FD, CONTROL_FD, describe=args.mode == "describe")


if __name__ == "__main__":
    main(sys.argv[1:])
