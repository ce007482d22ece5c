"""The test registry plus a crew that probes, from inside its worker, what a crew can reach.

``AIP_CREWAI_REGISTRY=tests.security.trust_crews:registry``. Its output's ``raw`` is JSON: for each pid
in the input's ``targets``, what reading its environ, PTRACE_ATTACH and pidfd_getfd gave (``ok`` or the
errno's name), and the worker's own descriptors, environment names, umask, dumpability and HOME.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
from collections.abc import Callable
from typing import Any

from crewai import Agent, Crew, Task
from crewai.crews.crew_output import CrewOutput
from crewai.types.usage_metrics import UsageMetrics

from tests.crews import registry as base_registry
from worker.demo import OfflineLLM

PTRACE_ATTACH = 16
PTRACE_DETACH = 17
WALL = 0x40000000  # __WALL: wait for a tracee that is not our child
SYS_PIDFD_GETFD = 438
PR_GET_DUMPABLE = 3

libc = ctypes.CDLL(None, use_errno=True)


def _outcome(call: Callable[[], object]) -> str:
    try:
        call()
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))
    return "ok"


def _read_environ(pid: int) -> None:
    with open(f"/proc/{pid}/environ", "rb") as environ:
        environ.read()


def _attach(pid: int) -> None:
    if libc.ptrace(PTRACE_ATTACH, pid, None, None) != 0:
        raise OSError(ctypes.get_errno(), "ptrace")
    # It worked (the test will fail): leave the target running as it was.
    os.waitpid(pid, WALL)
    libc.ptrace(PTRACE_DETACH, pid, None, None)


def _steal_descriptor(pid: int) -> None:
    pidfd = os.pidfd_open(pid)
    try:
        stolen = libc.syscall(SYS_PIDFD_GETFD, pidfd, 2, 0)  # its stderr: the supervisor's log
        if stolen < 0:
            raise OSError(ctypes.get_errno(), "pidfd_getfd")
        os.close(stolen)
    finally:
        os.close(pidfd)


def probe(targets: dict[str, int]) -> dict[str, Any]:
    descriptors = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            descriptors[name] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # the listing's own descriptor, closed already
    umask = os.umask(0o077)
    os.umask(umask)
    return {
        "targets": {
            name: {
                "environ": _outcome(lambda pid=pid: _read_environ(pid)),
                "ptrace": _outcome(lambda pid=pid: _attach(pid)),
                "pidfd_getfd": _outcome(lambda pid=pid: _steal_descriptor(pid)),
            }
            for name, pid in targets.items()
        },
        "fds": descriptors,
        "env": sorted(os.environ),
        "umask": umask,
        "dumpable": libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0),
        "home": os.environ.get("HOME"),
    }


class ProbeCrew(Crew):
    """A real Crew whose kickoff probes instead of calling a model (its answer is the probe's JSON)."""

    def kickoff(self, inputs: dict[str, Any] | None = None, *args: Any, **kwargs: Any) -> Any:
        if self.stream:  # CrewAI's streamed kickoff runs this one again with streaming off
            return super().kickoff(inputs, *args, **kwargs)
        findings = probe(dict((inputs or {}).get("targets", {})))
        return CrewOutput(raw=json.dumps(findings), tasks_output=[], token_usage=UsageMetrics())


def prober() -> Crew:
    agent = Agent(role="Prober", goal="Probe", backstory="Curious.", llm=OfflineLLM(model="prober"))
    return ProbeCrew(agents=[agent], tasks=[Task(description="Probe.", expected_output="Findings.", agent=agent)])


registry = {**base_registry, "prober": prober}
