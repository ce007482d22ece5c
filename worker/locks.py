"""CrewAI's named locks in a job: a file lock each, in the crew's storage, waited for in the kernel.

CrewAI takes a named lock around each write to the files a crew shares across processes: its kickoff outputs
three times a kickoff (opened, reset, a task's output added), its ChromaDB. Its own file locks
(``portalocker.Lock``) poll: a process that finds one held sleeps until the next quarter of a second, however
soon it was released. So jobs of one crew started together queue on their kickoff outputs, a quarter second at a
time, for a lock held a millisecond or two. Here a held lock is waited for in ``flock`` itself, which returns when
its holder releases it (or dies: the kernel releases a dead process's locks), so the next job takes it at once.

The wait runs in a thread of its own, so it can be given up after CrewAI's timeout, as CrewAI's lock gives up:
with portalocker's ``LockException``. A wait given up keeps its thread until ``flock`` returns, which then lets
go of the lock and closes the file at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from hashlib import md5


def backend(directory: str) -> Callable[..., AbstractContextManager[None]]:
    """CrewAI's lock backend (``crewai_core.lock_store.set_lock_backend``): a lock file in ``directory`` a name,
    named as CrewAI names its own."""

    def lock(name: str, *, timeout: float) -> AbstractContextManager[None]:
        channel = md5(name.encode(), usedforsecurity=False).hexdigest()
        return held(os.path.join(directory, f"crewai:{channel}.lock"), timeout)

    return lock


@contextlib.contextmanager
def held(path: str, timeout: float) -> Iterator[None]:
    """The file at ``path`` (made 0600 if missing) locked exclusively while the block runs; portalocker's
    ``LockException`` if another open file held it for ``timeout`` seconds."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        if not _Waiter(fd).taken(timeout):  # the waiter's now: it closes ``fd`` when its flock returns
            from portalocker.exceptions import LockException  # CrewAI's own lock raises it: no new failure

            raise LockException(f"{path} was still locked after {timeout:g} s") from None
    except BaseException:
        os.close(fd)
        raise
    try:
        yield
    finally:
        os.close(fd)  # lets go of the lock


class _Waiter:
    """A thread blocked in ``flock(fd, LOCK_EX)``. Whoever decides first owns ``fd``: the thread, handing the lock
    over if it was still wanted, or ``taken`` when its timeout passes first (the thread then closes ``fd``)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._decided = threading.Lock()
        self._outcome: bool | None = None  # None while undecided
        self._done = threading.Event()
        try:
            threading.Thread(target=self._wait, name="crewai-lock", daemon=True).start()
        except BaseException:  # no thread: nobody else will close it
            os.close(fd)
            raise

    def taken(self, timeout: float) -> bool:
        """Whether the lock came within ``timeout`` seconds (then ``fd`` is the caller's to close)."""
        self._done.wait(timeout)
        with self._decided:
            if self._outcome is None:
                self._outcome = False  # given up
            return self._outcome

    def _wait(self) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            locked = True
        except OSError:
            locked = False
        with self._decided:
            handed = locked and self._outcome is None
            if self._outcome is None:
                self._outcome = locked
            if not handed:
                os.close(self._fd)
        self._done.set()
