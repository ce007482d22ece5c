"""How a worker stays tied to its supervisor: death signal, control pipe, frame output."""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import threading

from protocol import QUIET_CREWAI, FrameError, Message, MessageReader, Start, Stop, pack

PR_SET_PDEATHSIG = 1
EXIT_ORPHANED = 75
EXIT_CONTROL_CLOSED = 76
EXIT_STOPPED = 77
EXIT_PROTOCOL = 78


def bind_to_parent(parent_pid: int) -> None:
    """Die with the supervisor: arm PDEATHSIG, then catch a parent that died before it was armed."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:
        os._exit(EXIT_ORPHANED)


def prepare_environment() -> None:
    """Telemetry off unless the operator chose otherwise; storage must be absolute."""
    for name, value in QUIET_CREWAI.items():
        os.environ.setdefault(name, value)
    storage = os.environ.get("CREWAI_STORAGE_DIR")
    if storage:
        if not os.path.isabs(storage):
            raise ValueError("CREWAI_STORAGE_DIR must be an absolute path")
        os.makedirs(storage, mode=0o700, exist_ok=True)
        # Without this marker the first replay per storage dir prints a tracing prompt.
        marker = os.path.join(storage, ".crewai_user.json")
        if not os.path.exists(marker):
            with open(marker, "w") as fh:
                fh.write('{"first_execution_done": true}')


def watch_control(fd: int) -> queue.Queue[Start]:
    """Read the control pipe in a daemon thread; EOF, Stop or garbage end the process at once."""
    starts: queue.Queue[Start] = queue.Queue(maxsize=1)

    def loop() -> None:
        reader = MessageReader()
        while True:
            data = os.read(fd, 65536)
            if not data:
                os._exit(EXIT_CONTROL_CLOSED)
            try:
                messages = reader.feed(data)
            except FrameError:
                os._exit(EXIT_PROTOCOL)
            for message in messages:
                if isinstance(message, Stop) or not isinstance(message, Start) or starts.full():
                    os._exit(EXIT_STOPPED if isinstance(message, Stop) else EXIT_PROTOCOL)
                starts.put(message)

    threading.Thread(target=loop, name="control", daemon=True).start()
    return starts


class FrameWriter:
    """Writes whole frames to the event pipe; a lock keeps frames from interleaving."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = threading.Lock()

    def send(self, message: Message) -> None:
        view = memoryview(pack(message))
        with self._lock:
            while view:
                view = view[os.write(self._fd, view) :]
