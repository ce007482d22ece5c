"""``python -m worker job|describe|check|forkserver``: the processes the supervisor launches.

A job, describing or checking worker (``check``: ``crew-supervisor doctor`` builds every crew once)
finds its control pipe on fd 3 and its event pipe on fd 4; the fork server finds its socket on fd 3.
"""

from __future__ import annotations

import argparse
import os
import sys

from protocol import CONTROL_FD, CREW, CWD, EVENT_FD, PARENT_PID, Mode
from worker import forkserver, job, tether
from worker.state import WorkerState


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m worker")
    parser.add_argument("mode", type=Mode, choices=list(Mode))
    parser.add_argument(PARENT_PID, type=int, required=True)
    parser.add_argument(CWD, help="working directory (the job's scratch directory)")
    parser.add_argument(CREW, help="check: build this crew alone, with no warm-up rehearsed (its env file's)")
    args = parser.parse_args(argv)
    settings = tether.take_settings()
    tether.quiet_crewai_logs()
    # Before the registry is imported: no crew code runs with a capability, nor as root's uid with WORKER_IDS.
    state = WorkerState(settings, tether.confine(settings))  # this process's, passed to all that needs it
    # After: a uid change clears the death signal. A parent that died before it was armed is caught here.
    tether.bind_to_parent(args.parent_pid)
    if args.cwd:
        os.chdir(args.cwd)
    if args.mode is Mode.FORKSERVER:
        forkserver.serve(state, CONTROL_FD)  # at the supervisor's priority: its forks are on every start's path
    tether.lower_priority(settings)
    job.run(state, EVENT_FD, CONTROL_FD, mode=args.mode, only=args.crew)


if __name__ == "__main__":
    main(sys.argv[1:])
