"""A crew that probes, from inside its worker, what a crew can reach: part of ``tests.crews:registry``.

Given ``attack`` (a pid), its output's ``raw`` is
JSON: what each of ``tests/helpers/attacks.py``'s attacks on that process and on the kernel gave, and the worker's
seccomp mode and no_new_privs. Else: for each pid in the input's ``targets``, what reading its environ,
PTRACE_ATTACH and pidfd_getfd gave (``ok`` or the errno's name), and the worker's own descriptors, environment
names, umask, dumpability and HOME. For the separate worker user (``test_worker_user.py``) also: its uids, gids,
groups and capability sets, what signal 0 to each pid in ``signals`` gave, what reading each path in ``reads``
gave (a directory is listed), and what writing a file in its working directory, HOME and CrewAI storage gave.
Given ``environ`` (``test_crew_env.py``): its os.environ (each value's digest), the names in its initial
environment block, and the environment CrewAI was imported in.
Given ``neighbours`` (names to pids, ``test_seccomp.py``): what changing each one's limits, nice value, scheduling,
affinity and I/O priority gave, the same calls on the worker itself, SysV IPC and POSIX shared memory.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import site
import threading
from typing import Any

from crewai import Agent, Crew, Task
from crewai.crews.crew_output import CrewOutput
from crewai.types.usage_metrics import UsageMetrics

from protocol import CONTROL_FD, Message, MessageReader
from tests.helpers.attacks import (
    attach,
    attacks,
    change_itself,
    connect_abstract,
    open_memory,
    outcome,
    reach_others,
    read_environ,
    steal_descriptor,
    sysv,
)
from worker.demo import OfflineLLM

PR_GET_DUMPABLE = 3
PLACES = ("HOME", "CREWAI_STORAGE_DIR")  # the worker's own directories, from its environment

libc = ctypes.CDLL(None, use_errno=True)


def _read(path: str) -> None:
    if os.path.isdir(path):
        os.listdir(path)
    else:
        with open(path, "rb") as file:
            file.read(1)


def _write_in(directory: str) -> None:
    with open(os.path.join(directory, "probe-wrote-here"), "w") as file:
        file.write("ok")


def _change(path: str) -> None:
    """Write into ``path``: a new file in a directory, or a byte appended to a file."""
    if os.path.isdir(path):
        _write_in(path)
    else:
        with open(path, "ab") as file:
            file.write(b"")


def _capabilities() -> dict[str, str]:
    with open("/proc/self/status") as status:
        fields = dict(line.split(":\t", 1) for line in status if line.startswith("Cap"))
    return {name: value.strip() for name, value in fields.items()}


def _filter_status() -> dict[str, str]:
    """This process's seccomp mode and no_new_privs flag, as /proc says them (2 and 1 under the worker's filter)."""
    with open("/proc/self/status") as status:
        fields = dict(line.rstrip("\n").split(":\t", 1) for line in status if ":\t" in line)
    return {name: fields[name].strip() for name in ("Seccomp", "NoNewPrivs")}


def probe(
    targets: dict[str, int], signals: dict[str, int] | None = None, reads: list[str] | None = None
) -> dict[str, Any]:
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
                "environ": outcome(lambda pid=pid: read_environ(pid)),
                "ptrace": outcome(lambda pid=pid: attach(pid)),
                "pidfd_getfd": outcome(lambda pid=pid: steal_descriptor(pid)),
            }
            for name, pid in targets.items()
        },
        "fds": descriptors,
        "env": sorted(os.environ),
        "umask": umask,
        "dumpable": libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0),
        "home": os.environ.get("HOME"),
        "uids": os.getresuid(),
        "gids": os.getresgid(),
        "groups": os.getgroups(),
        "capabilities": _capabilities(),
        "cwd": os.getcwd(),
        "signals": {name: outcome(lambda pid=pid: os.kill(pid, 0)) for name, pid in (signals or {}).items()},
        "reads": {path: outcome(lambda path=path: _read(path)) for path in reads or []},
        "writes": {
            place: outcome(lambda directory=directory: _write_in(directory))
            for place, directory in (("cwd", os.getcwd()), *((name, os.environ[name]) for name in PLACES))
        },
    }


def reach(given: dict[str, Any]) -> dict[str, Any]:
    """What a job reaches outside its own (``tests/system/security/test_sandbox.py``): reading and changing each path,
    each process's memory, environ, ptrace, pidfd_getfd and signal 0, an abstract socket; and its own places."""
    own = {"cwd": os.getcwd(), **{name: os.environ[name] for name in (*PLACES, "TMPDIR")}, "devnull": os.devnull}
    return {
        "reads": {path: outcome(lambda path=path: _read(path)) for path in given["reads"]},
        "changes": {path: outcome(lambda path=path: _change(path)) for path in given["changes"]},
        "processes": {
            name: {
                "mem": outcome(lambda pid=pid: open_memory(pid)),
                "environ": outcome(lambda pid=pid: read_environ(pid)),
                "ptrace": outcome(lambda pid=pid: attach(pid)),
                "pidfd_getfd": outcome(lambda pid=pid: steal_descriptor(pid)),
                "signal": outcome(lambda pid=pid: os.kill(pid, 0)),
            }
            for name, pid in given["processes"].items()
        },
        "abstract": outcome(lambda: connect_abstract(given["abstract"])),
        "truncates": {path: outcome(lambda path=path: _truncate_to_size(path)) for path in given.get("truncates", [])},
        "control_thread": _read_on_control_thread(given["reads"][0]) if given.get("control_thread") else "",
        "own": {name: outcome(lambda path=path: _change(path)) for name, path in own.items()},
        "own_reads": {name: outcome(lambda path=path: _read(path)) for name, path in own.items()},
    }


def _truncate_to_size(path: str) -> None:
    """truncate(2) by path, to the size it has: harmless should it pass (Landlock judges it from ABI 3; seccomp
    refuses it in a sandbox on ABI 2)."""
    os.truncate(path, os.stat(path).st_size)


def _read_on_control_thread(path: str) -> str:
    """Crew code borrowing the thread that watches the worker's control pipe: it replaces what that thread calls
    with the bytes it reads, then reopens the pipe (fd 3) for writing and writes a byte. The thread must be in the
    job's domain too (Landlock confines threads one by one)."""
    found: dict[str, str] = {}
    read = threading.Event()
    original = MessageReader.feed

    def borrowed(reader: MessageReader, data: bytes) -> list[Message]:
        found["read"] = outcome(lambda: _read(path))
        read.set()
        return []

    MessageReader.feed = borrowed  # type: ignore[method-assign]
    try:
        with open(f"/proc/self/fd/{CONTROL_FD}", "wb", buffering=0) as pipe:
            pipe.write(b"x")
        read.wait(30)
    finally:
        MessageReader.feed = original  # type: ignore[method-assign]
    return found.get("read", "no control thread")


def posix_shared_memory() -> None:
    """A POSIX shared memory object, as glibc's ``shm_open`` makes one (a file in /dev/shm), removed at once should
    it be made (``multiprocessing.shared_memory`` would start its resource tracker first)."""
    path = f"/dev/shm/crew-probe-{os.getpid()}"
    os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
    os.unlink(path)


def plant(text: str) -> str:
    """A .pth file in this crew's user site-packages (beneath its HOME, which its jobs may change): Python would run
    it when the crew's next worker starts, were that worker's user site on. Where it was planted."""
    directory = site.getusersitepackages()
    os.makedirs(directory, exist_ok=True)
    planted = os.path.join(directory, "planted.pth")
    with open(planted, "w") as file:
        file.write(text)
    return planted


def environment() -> dict[str, Any]:
    """The job's os.environ, each value as its SHA-256 (a key would be masked in the job's output: a digest says which
    it was), the names in its process's initial environment block (/proc/self/environ: what it was started or
    forked with, whatever os.environ says now), and the environment CrewAI was imported in (``IMPORTED_IN``)."""
    with open("/proc/self/environ", "rb") as block:
        initial = sorted(item.split(b"=", 1)[0].decode() for item in block.read().split(b"\0") if item)
    return {
        "environ": {name: digest(value) for name, value in os.environ.items()},
        "initial": initial,
        "imported_in": IMPORTED_IN,
    }


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


# The environment this module, and CrewAI with it, was imported in (each value's digest): the fork server's, which
# imports the registry once for every worker it forks, or a spawned worker's own.
IMPORTED_IN = {name: digest(value) for name, value in os.environ.items()}


class ProbeCrew(Crew):
    """A real Crew whose kickoff probes instead of calling a model (its answer is the probe's JSON)."""

    def kickoff(self, inputs: dict[str, Any] | None = None, *args: Any, **kwargs: Any) -> Any:
        if self.stream:  # CrewAI's streamed kickoff runs this one again with streaming off
            return super().kickoff(inputs, *args, **kwargs)
        given = inputs or {}
        if "attack" in given:  # the seccomp deny-list, on another process (``tests/system/security/test_seccomp.py``)
            findings = {"attacks": attacks(int(given["attack"])), "filter": _filter_status()}
        elif "neighbours" in given:  # other processes' limits and priorities, and IPC (``test_seccomp.py``)
            findings = {
                "others": {name: reach_others(pid) for name, pid in given["neighbours"].items()},
                "itself": change_itself(),
                "sysv": sysv(),
                "posix_shm": outcome(posix_shared_memory),
            }
        elif "reach" in given:  # a job's sandbox (``tests/system/security/test_sandbox.py``)
            findings = reach(given["reach"])
        elif "plant" in given:  # a file Python would run at a cold worker's start (``test_sandbox.py``)
            findings = {"planted": plant(given["plant"])}
        elif given.get("environ"):  # what a job's code sees of the environment (``test_crew_env.py``)
            findings = environment()
        else:
            targets, signals, reads = dict(given.get("targets", {})), dict(given.get("signals", {})), given.get("reads")
            findings = probe(targets, signals, list(reads or []))
        return CrewOutput(raw=json.dumps(findings), tasks_output=[], token_usage=UsageMetrics())


def prober() -> Crew:
    agent = Agent(role="Prober", goal="Probe", backstory="Curious.", llm=OfflineLLM(model="prober"))
    return ProbeCrew(agents=[agent], tasks=[Task(description="Probe.", expected_output="Findings.", agent=agent)])


# crew-a and crew-b probe as two crews with keys of their own
CREWS = {"prober": prober, "crew-a": prober, "crew-b": prober}
