"""The fork server: imports CrewAI and the registry once, warms CrewAI, forks a worker per job.

Warming (``warmup.py``) runs kickoffs of our own crews, offline and (unless ``WARMUP=offline``) on each
installed provider against a provider of its own on loopback, so no child repeats CrewAI's first-use
work, and parses the TLS contexts a job's HTTP clients will take (``tls.py``); then it stops the
event-bus threads the kickoffs started: forking with them alive hangs the child. If that cannot be done
the fork server refuses to start, saying why in one line, and the supervisor spawns workers cold. It must
stay single-threaded: it checks before every fork and refuses, then exits, if not.
Each worker is forked as the supervisor's own child (``beside.py``: ``clone`` with ``CLONE_PARENT``; on a machine
where that call is not known, or while a native thread runs beside it, through a middle process that leaves at
once, the supervisor being a subreaper): the supervisor reaps it and reads its exit status, and the fork server's
death takes no worker with it. A worker
leads a process group, ties its death signal to the supervisor once adopted, and carries the name ``crew-worker``
(``ps``, ``top``), its job's crew and action id as its command line once it has one.
"""

from __future__ import annotations

import dataclasses
import fcntl
import gc
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

from protocol import (
    CONTROL_FD,
    EVENT_FD,
    MAX_FRAME_BYTES,
    ExitCode,
    Fork,
    Forked,
    MessageReader,
    Reason,
    Refused,
)
from worker import beside, job, prefault, tether, warmup
from worker.state import WorkerState

EXIT_NOT_SINGLE_THREADED = 79
EXIT_NOT_WARMED = 80
ADOPTION_SECONDS = 5.0
JOB_FDS = 4  # control, events, stdout, stderr


def serve(state: WorkerState, socket_fd: int) -> NoReturn:
    """Warm up, then fork a worker for each ``Fork`` until the supervisor is gone. Each worker's state is the fork
    server's (``state``, its TLS pool made by the warm-up) with the settings of its own environment."""
    channel = socket.socket(fileno=socket_fd)
    # Before the registry's code runs here: no worker may read this process's memory or attach to it.
    # Its workers inherit the flag; each sets it back when it takes a job (job.enter).
    tether.set_dumpable(False)
    tether.prepare_environment()
    out = tether.FrameWriter(socket_fd)  # SOCK_SEQPACKET: each frame is one whole packet
    crews = job.load(state, out)  # imports the registry (and crewai, here or in warm), once for every job to come
    if crews is None:
        os._exit(1)
    try:
        warmth = warmup.warm(state)
    except warmup.WarmupError as exc:
        line = " ".join(str(exc).split())[:1000]  # one line for the supervisor's log
        out.send(job.failed(Reason.WARMUP_FAILED, Reason.WARMUP_FAILED, line, False))
        os._exit(EXIT_NOT_WARMED)
    gc.collect()  # the warm-up's garbage, so it is not frozen with the rest
    gc.freeze()  # what is imported and warmed now stays shared with every child
    # Learned from a child forked as workers are.
    written = prefault.probe(lambda: warmup.rehearse(state.settings, providers=False))
    out.send(job.describe_registry(state, crews, dataclasses.asdict(warmth)))
    supervisor = os.getppid()
    while True:
        _fork_one(state, channel, out, crews, written, supervisor)


def _fork_one(
    state: WorkerState,
    channel: socket.socket,
    out: tether.FrameWriter,
    crews: dict[str, Any],
    written: prefault.Runs,
    supervisor: int,
) -> None:
    data, fds, _, _ = socket.recv_fds(channel, MAX_FRAME_BYTES, JOB_FDS)
    if not data:
        os._exit(0)  # the supervisor is gone
    messages = MessageReader().feed(data)
    if len(messages) != 1 or not isinstance(messages[0], Fork) or len(fds) != JOB_FDS:
        for fd in fds:
            os.close(fd)
        out.send(Refused(reason="malformed fork request"))
        return
    if threading.active_count() != 1:
        out.send(Refused(reason=f"fork server has {threading.active_count()} threads; forking could hang"))
        os._exit(EXIT_NOT_SINGLE_THREADED)
    sys.stdout.flush()
    sys.stderr.flush()
    fork = messages[0]
    become = lambda middle: _become_worker(state, fork, fds, (supervisor, middle), crews, written, [channel.fileno()])  # noqa: E731
    pid = _fork_beside(become, supervisor) if beside.supported() and beside.alone() else _double_fork(become)
    for fd in fds:
        os.close(fd)
    out.send(Forked(pid=pid))


def _fork_beside(become: Callable[[int], NoReturn], supervisor: int) -> int:
    """Fork a worker as the supervisor's own child (``beside.fork_beside``): ``become`` is given the supervisor's pid
    as its middle's, for there is none. The worker's pid, or 0 if the fork failed."""
    try:
        pid = beside.fork_beside()
    except OSError:  # EAGAIN (a process limit), ENOMEM: no worker this time, and the supervisor is told
        return 0
    if pid == 0:
        become(supervisor)
    return pid


def _double_fork(become: Callable[[int], NoReturn]) -> int:
    """Fork a worker through a middle process that leaves at once: the worker is then the supervisor's
    child (it is a subreaper), so the fork server's death takes no worker with it, and the supervisor
    reaps it and reads its exit status itself. ``become`` is given the middle's pid. The worker's pid, or 0
    if a fork failed."""
    read, write = os.pipe()
    try:
        middle = os.fork()
    except OSError:  # EAGAIN (a process limit), ENOMEM: no worker this time, and the supervisor is told
        os.close(read)
        os.close(write)
        return 0
    if middle == 0:
        os.close(read)
        status = 1
        try:
            middle = os.getpid()
            pid = os.fork()
            if pid == 0:
                os.close(write)
                become(middle)
            os.write(write, pid.to_bytes(4, "little"))
            status = 0
        finally:
            os._exit(status)
    os.close(write)
    try:
        answer = os.read(read, 4)
    finally:
        os.close(read)
        os.waitpid(middle, 0)  # its exit is what hands the worker over
    return int.from_bytes(answer, "little") if len(answer) == 4 else 0


def _become_worker(
    server: WorkerState,
    request: Fork,
    fds: list[int],
    parents: tuple[int, int],  # the supervisor's pid, the middle's
    crews: dict[str, Any],
    written: prefault.Runs,
    close: list[int],
) -> NoReturn:
    for fd in close:
        os.close(fd)
    # A process group of its own, to be killed whole; our session, so that its nice value counts against
    # the supervisor's (where the kernel groups scheduling by session, a new one would weigh as much).
    os.setpgid(0, 0)
    tether.name_worker()
    tether.lower_priority(server.settings)
    supervisor, middle = parents
    _await_adoption(supervisor, middle)
    tether.bind_to_parent(supervisor)
    # Move the received descriptors clear of 0-4 first, so placing one never clobbers another.
    control, events, stdout, stderr = (fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in fds)
    for fd in fds:
        os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    for source, target in ((null, 0), (stdout, 1), (stderr, 2), (control, CONTROL_FD), (events, EVENT_FD)):
        os.dup2(source, target)
        os.close(source)
    os.chdir(request.cwd)
    state = WorkerState(tether.adopt_environment(request.env, server.settings), server.confinement, server.pool)
    # Before it says hello: a worker forked ahead of demand is idle now, not yet started. One forked for a job
    # waiting faults in only the pages it writes, on the CPU it would spend copying them all ahead. Its job's
    # sandbox is made ready then too (``job.domain_ahead``).
    if request.prefault:
        prefault.populate(written)
    job.run(state, EVENT_FD, CONTROL_FD, crews=crews, domain=job.domain_ahead(state))


def _await_adoption(supervisor: int, middle: int) -> None:
    """Wait until the middle process has left and the supervisor has adopted us (a few ms at most):
    only then can the death signal be tied to the supervisor. Adopted by anyone else, the supervisor died
    first, and we leave at once: no death signal covers us yet, so waiting would outlive it (a restarted
    supervisor could be serving before the deadline). Past the deadline we are nobody's either."""
    deadline = time.monotonic() + ADOPTION_SECONDS
    while (parent := os.getppid()) != supervisor:
        if parent != middle or time.monotonic() > deadline:
            os._exit(ExitCode.ORPHANED)
        time.sleep(0.0002)
