"""CrewAI's named locks in a job (worker/locks.py): real flock locks on real files, a holder beside the waiter."""

from __future__ import annotations

import fcntl
import os
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from hashlib import md5
from pathlib import Path
from types import FrameType

import pytest
from portalocker.exceptions import LockException

from tests.helpers.waiting import SLOWDOWN, wait_until
from worker import locks

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def holding(path: Path) -> Iterator[None]:
    """The lock held through an open file of our own: another job's worker holding it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def queued_in_kernel(path: Path) -> bool:
    """Whether /proc/locks shows this process blocked on ``path``'s lock (a ``->`` line): a waiter the release
    wakes, where a poller (LOCK_NB, then sleep) is never queued there."""
    inode = os.stat(path).st_ino
    with open("/proc/locks") as table:
        waiting = [line.split()[2:] for line in table if "->" in line.split()[:2]]
    # FLOCK ADVISORY WRITE <pid> <major:minor:inode> ...
    return any(fields[3] == str(os.getpid()) and fields[4].endswith(f":{inode}") for fields in waiting)


def free(path: Path) -> bool:
    fd = os.open(path, os.O_WRONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def open_here(path: Path) -> bool:
    target = os.path.realpath(path)  # as /proc/self/fd names it, wherever tmp_path's links lead
    return any(os.path.realpath(f"/proc/self/fd/{fd}") == target for fd in os.listdir("/proc/self/fd"))


def let_go(path: Path) -> bool:
    """Whether nothing of this process holds or waits for the lock any more (a given-up waiter's thread closes its
    file once its flock returns)."""
    return wait_until(lambda: not open_here(path) and free(path))


def test_a_free_lock_is_taken_at_once_and_excludes_others_while_held(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    with locks.held(str(path), timeout=5):
        assert not free(path)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert free(path) and not open_here(path)


def test_a_held_lock_is_waited_for_in_the_kernel_and_taken_when_let_go(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    inside = threading.Event()

    def take() -> None:
        with locks.held(str(path), timeout=60):
            inside.set()

    with holding(path):
        waiter = threading.Thread(target=take)
        waiter.start()
        assert wait_until(lambda: queued_in_kernel(path)), "the waiter is not queued on the lock in the kernel"
        assert not inside.is_set()
    waiter.join(30 * SLOWDOWN)
    assert inside.is_set() and let_go(path)


def test_a_lock_held_past_the_timeout_raises_as_crewai_s_own_and_is_let_go_when_it_comes(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    with holding(path):
        with pytest.raises(LockException, match=r"still locked after 0\.1 s"), locks.held(str(path), timeout=0.1):
            pytest.fail("the block ran without the lock")
        assert wait_until(lambda: queued_in_kernel(path))  # the given-up wait, until the lock comes
    assert let_go(path)


def test_a_holder_killed_wakes_the_waiter(tmp_path: Path) -> None:
    """The kernel lets go of a dead process's locks: the waiter takes it then, whatever the holder left."""
    path = tmp_path / "lock"
    hold = (
        f"import fcntl, os, sys; fd = os.open({str(path)!r}, os.O_WRONLY | os.O_CREAT); "
        "fcntl.flock(fd, fcntl.LOCK_EX); print(flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen([sys.executable, "-c", hold], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"\n"
        inside = threading.Event()

        def take() -> None:
            with locks.held(str(path), timeout=60):
                inside.set()

        waiter = threading.Thread(target=take)
        waiter.start()
        assert wait_until(lambda: queued_in_kernel(path))
        holder.kill()
        waiter.join(30 * SLOWDOWN)
        assert inside.is_set()
    finally:
        holder.kill()
        holder.wait()
    assert let_go(path)


def test_a_wait_interrupted_lets_go_of_the_lock_when_it_comes(tmp_path: Path) -> None:
    """An exception in the middle of the wait (a signal handler's, here) leaves no file open and no lock held."""
    path = tmp_path / "lock"

    class Interrupted(Exception):
        pass

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise Interrupted

    def interrupt_once_queued() -> None:
        if wait_until(lambda: queued_in_kernel(path)):
            os.kill(os.getpid(), signal.SIGUSR1)  # its handler runs in the main thread, the one waiting

    previous = signal.signal(signal.SIGUSR1, interrupt)
    try:
        with holding(path):
            threading.Thread(target=interrupt_once_queued, daemon=True).start()
            with pytest.raises(Interrupted), locks.held(str(path), timeout=60):
                pytest.fail("the block ran without the lock")
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert let_go(path)


def test_no_thread_to_wait_in_is_crewai_s_lock_exception_and_leaves_nothing_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "lock"

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    with holding(path):
        monkeypatch.setattr(threading.Thread, "start", refuse)
        with pytest.raises(LockException, match="no thread to wait"), locks.held(str(path), timeout=60):
            pytest.fail("the block ran without the lock")
        monkeypatch.undo()
    assert let_go(path)


def test_crewai_s_locks_are_files_in_the_job_s_crew_storage_named_as_crewai_names_its_own(tmp_path: Path) -> None:
    """In a process of its own, as in a worker: ``places.follow_job`` sets CrewAI's lock backend for good."""
    storage = tmp_path / "storage"
    storage.mkdir()
    probe = (
        "import os; from worker import places; from crewai_core import lock_store; places.follow_job(); "
        "lock = lock_store.lock('sqlite:/a/b.db'); lock.__enter__(); print(sorted(os.listdir(os.path.join("
        f"{str(storage)!r}, 'locks'))))"
    )
    env = {**os.environ, "CREWAI_STORAGE_DIR": str(storage), "PYTHONPATH": str(ROOT)}
    env.pop("REDIS_URL", None)
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    channel = md5(b"sqlite:/a/b.db", usedforsecurity=False).hexdigest()
    assert done.stdout.strip() == str([f"crewai:{channel}.lock"])
    assert stat.S_IMODE(os.stat(storage / "locks").st_mode) == 0o700
