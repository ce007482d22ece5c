"""Launches one real worker, prints its pid, then waits to be killed: for the PDEATHSIG test.

A ``sleep`` keeps a copy of the control pipe open, so the worker cannot leave on EOF: only the
death signal can stop it. Prints the worker's pid, then the keeper's.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

from protocol import Start
from supervisor.processes.launcher import SpawnLauncher
from supervisor.processes.reaper import Reaper


async def main() -> None:
    worker = await SpawnLauncher(Reaper()).spawn(dict(os.environ), os.getcwd())
    worker.send(Start("orphan", "demo-slow", "run", {"seconds": 600}, 600_000))
    await worker.next_message()  # hello: sent after the worker armed its death signal
    keeper = subprocess.Popen(["sleep", "3600"], pass_fds=[worker._pipes.control])
    print(worker.pid, keeper.pid, flush=True)
    await asyncio.sleep(3600)


asyncio.run(main())
sys.exit(0)
