"""The fork server: imports CrewAI and the registry once, warms CrewAI, forks a worker per job.

Warming (``warmup.py``) runs one offline kickoff of our own crew so no child repeats CrewAI's
first-use work, then stops the event-bus threads that kickoff started: forking with them alive hangs
the child. If that cannot be done the fork server refuses to start, saying why in one line, and the
supervisor spawns workers cold. It must stay single-threaded: it checks before every fork and
refuses, then exits, if not.
Its children are its own (it reaps them and reports their exit status); each leads a new session
and dies with this process (PDEATHSIG), which dies with the supervisor.
"""

from __future__ import annotations

import fcntl
import gc
import os
import selectors
import signal
import socket
import sys
import threading
from typing import Any, NoReturn

from protocol import (
    CONTROL_FD,
    EVENT_FD,
    MAX_FRAME_BYTES,
    WARMUP_FAILED,
    Exited,
    Fork,
    Forked,
    MessageReader,
    Refused,
)
from worker import job, lifecycle, prefault, warmup

EXIT_NOT_SINGLE_THREADED = 79
EXIT_NOT_WARMED = 80
JOB_FDS = 4  # control, events, stdout, stderr


def serve(socket_fd: int) -> NoReturn:
    channel = socket.socket(fileno=socket_fd)
    # Before the registry's code runs here: no worker may read this process's memory or attach to it.
    # Its workers inherit the flag; each sets it back when it takes a job (job.enter).
    lifecycle.set_dumpable(False)
    lifecycle.prepare_environment()
    out = lifecycle.FrameWriter(socket_fd)  # SOCK_SEQPACKET: each frame is one whole packet
    crews = job.load(out)  # imports crewai and the registry, once for every job to come
    if crews is None:
        os._exit(1)
    try:
        warmup.warm()
    except warmup.WarmupError as exc:
        line = " ".join(str(exc).split())[:1000]  # one line for the supervisor's log
        out.send(job.failed(WARMUP_FAILED, WARMUP_FAILED, line, False))
        os._exit(EXIT_NOT_WARMED)
    gc.collect()  # the warm-up's garbage, so it is not frozen with the rest
    gc.freeze()  # what is imported and warmed now stays shared with every child
    written = prefault.probe(warmup.rehearse)  # learned from a child forked as workers are
    out.send(job.describe_registry(crews))
    wake_r, wake_w = os.pipe()
    for fd in (wake_r, wake_w):
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a Python handler, so the wakeup fd is written
    selector = selectors.DefaultSelector()
    selector.register(channel, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    while True:
        for key, _ in selector.select():
            if key.fd == wake_r:
                while _drain(wake_r):
                    pass
                _reap(out)
            else:
                _fork_one(channel, out, crews, written, (wake_r, wake_w))


def _fork_one(
    channel: socket.socket,
    out: lifecycle.FrameWriter,
    crews: dict[str, Any],
    written: prefault.Runs,
    own_fds: tuple[int, int],
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
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        _become_worker(messages[0], fds, parent, crews, written, [channel.fileno(), *own_fds])
    for fd in fds:
        os.close(fd)
    out.send(Forked(pid=pid))


def _become_worker(
    request: Fork, fds: list[int], parent: int, crews: dict[str, Any], written: prefault.Runs, close: list[int]
) -> NoReturn:
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in close:
        os.close(fd)
    os.setsid()
    lifecycle.bind_to_parent(parent)
    # Move the received descriptors clear of 0-4 first, so placing one never clobbers another.
    control, events, stdout, stderr = (fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in fds)
    for fd in fds:
        os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    for source, target in ((null, 0), (stdout, 1), (stderr, 2), (control, CONTROL_FD), (events, EVENT_FD)):
        os.dup2(source, target)
        os.close(source)
    os.chdir(request.cwd)
    os.environ.clear()
    os.environ.update(request.env)
    prefault.populate(written)  # before it says hello: a pre-forked worker is idle now, not yet started
    job.run(EVENT_FD, CONTROL_FD, crews=crews)


def _reap(out: lifecycle.FrameWriter) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        out.send(Exited(pid=pid, exit_status=os.waitstatus_to_exitcode(status)))


def _drain(fd: int) -> bool:
    try:
        return bool(os.read(fd, 512))
    except BlockingIOError:
        return False
