"""A forked worker's adoption: it waits for the supervisor to adopt it, and leaves at once when anyone else
does (the supervisor died first: no death signal covers it yet, so waiting would outlive the supervisor)."""

from __future__ import annotations

import subprocess
import sys

import orjson
import pytest

from protocol import ExitCode
from tests.conftest import ROOT
from worker import forkserver

# Plays the process that adopts the worker once its middle leaves: a subreaper, the supervisor or not.
ADOPTER = """
import ctypes, os, sys, time
import orjson
from worker import forkserver
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: the worker comes to us
supervisor = os.getpid() if sys.argv[1] == "supervisor" else int(sys.argv[2])
middle = os.fork()
if middle == 0:
    me = os.getpid()
    if os.fork() == 0:
        forkserver._await_adoption(supervisor, me)
        os._exit(0)  # adopted by the supervisor
    os._exit(0)
os.waitpid(middle, 0)
left = time.monotonic()
_, status = os.wait()  # the worker, adopted by us
print(orjson.dumps({"code": os.waitstatus_to_exitcode(status), "seconds": time.monotonic() - left}).decode())
"""


def adopted_by(who: str) -> dict[str, float]:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    done = subprocess.run(
        [sys.executable, "-c", ADOPTER, who, gone.stdout.strip()],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return orjson.loads(done.stdout)


def test_a_worker_the_supervisor_adopts_goes_on() -> None:
    assert adopted_by("supervisor")["code"] == 0


@pytest.mark.timeout(120)
def test_a_worker_adopted_by_another_leaves_at_once_not_at_the_deadline() -> None:
    answer = adopted_by("another")  # its supervisor is a process that has exited
    assert answer["code"] == ExitCode.ORPHANED
    # Before, it waited out the deadline (ADOPTION_SECONDS) from its start: a supervisor restarted within it
    # found an old worker alive. Now it leaves on its next look at its parent, ~0.2 ms; half the deadline
    # is a ceiling a machine at load 10 keeps and the old behaviour cannot.
    assert answer["seconds"] < forkserver.ADOPTION_SECONDS / 2, answer
