"""CrewAI's named locks in a job: a file lock each, in the crew's storage, waited for in the kernel.

CrewAI takes a named lock around each write to the files a crew shares across processes: its kickoff outputs
when the crew is built, when a kickoff starts and after each task; its ChromaDB. Its own file locks
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

from portalocker.exceptions import LockException  # CrewAI's own lock raises it: no new kind of failure


def backend(directory: str) -> Callable[..., AbstractContextManager[None]]:
    """CrewAI's lock backend (``crewai_core.lock_store.set_lock_backend``): a lock file in ``directory`` a name,
    named as CrewAI names its own."""

    def lock(name: str, *, timeout: float) -> AbstractContextManager[None]:
        channel = md5(name.encode(), usedforsecurity=False).hexdigest()
        return held(os.path.join(directory, f"crewai:{channel}.lock"), timeout)

    return lock


@contextlib.contextmanager
def held(path: str, timeout: float) -> Iterator[None]:
    """The file at ``path`` (made 0600 if missing) locked exclusively while the block runs; ``LockException`` if
    another open file held it for ``timeout`` seconds."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    ours = True  # whether closing ``fd`` is ours to do (and lets go of the lock if we hold it)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            ours = False  # the waiter's, until it hands the lock over
            _Waiter(fd).wait(timeout, path)
            ours = True
        yield
    finally:
        if ours:
            os.close(fd)


class _Waiter:
    """A thread blocked in ``flock(fd, LOCK_EX)`` for whoever waits in ``wait``. Whichever decides first owns
    ``fd``: the thread, if the wait was given up (it closes ``fd`` once ``flock`` returns), or the waiter, if the
    thread took the lock while it was still wanted. They decide one at a time, under ``_decided``."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._decided = threading.Lock()
        self._handed: bool | None = None  # None: undecided; True: the lock is the waiter's; False: given up
        self._error: OSError | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._wait, name="crewai-lock", daemon=True)

    def wait(self, timeout: float, path: str) -> None:
        """Return once the lock is taken, ``fd`` then the caller's; or raise (``LockException`` past
        ``timeout`` seconds, or whatever interrupted the wait), ``fd`` then no longer the caller's."""
        try:
            try:
                self._thread.start()
            except RuntimeError as exc:  # no thread was made (the job's thread limit): nobody else will close it
                os.close(self._fd)
                raise LockException(f"{path}: no thread to wait for its lock in: {exc}") from exc
            self._done.wait(timeout)
        except BaseException:  # interrupted (or no thread): given up, unless the lock came first
            if self._give_up():
                os.close(self._fd)
            raise
        if not self._give_up():
            if self._error is not None:
                raise LockException(f"{path} could not be locked: {self._error}") from self._error
            raise LockException(f"{path} was still locked after {timeout:g} s")

    def _give_up(self) -> bool:
        """Whether the lock was handed over before now; if not, it never will be."""
        with self._decided:
            if self._handed is None:
                self._handed = False
            return self._handed

    def _wait(self) -> None:
        try:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            except OSError as exc:
                self._error = exc
            with self._decided:
                if self._handed is None:
                    self._handed = self._error is None
                handed = self._handed
            if not handed:
                os.close(self._fd)
        finally:
            self._done.set()
