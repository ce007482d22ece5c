"""CrewAI's named locks in a job (worker/locks.py): real flock locks on real files, a holder beside the waiter."""

from __future__ import annotations

import fcntl
import os
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from hashlib import md5
from pathlib import Path

import pytest
from portalocker.exceptions import LockException

from tests.helpers.waiting import wait_until
from worker import locks


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
    """Whether /proc/locks shows a waiter blocked on ``path``'s lock (a ``->`` line): one woken by its release,
    where a poller (LOCK_NB, then sleep) is never queued there."""
    inode = os.stat(path).st_ino
    with open("/proc/locks") as table:
        return any("->" in line and line.split()[6].endswith(f":{inode}") for line in table)


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
    return any(os.path.realpath(f"/proc/self/fd/{fd}") == str(path) for fd in os.listdir("/proc/self/fd"))


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
    waiter.join(30)
    assert inside.is_set() and free(path) and not open_here(path)


def test_a_lock_held_past_the_timeout_raises_as_crewai_s_own_and_is_let_go_when_it_comes(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    with holding(path):
        with pytest.raises(LockException, match="still locked after 0.1 s"):
            with locks.held(str(path), timeout=0.1):
                pytest.fail("the block ran without the lock")
        assert queued_in_kernel(path)  # the given-up wait is still queued
    # The holder let go: the given-up waiter takes the lock, lets go of it and closes its file at once.
    assert wait_until(lambda: not open_here(path))
    assert free(path)


def test_crewai_s_locks_are_files_named_as_crewai_names_its_own(tmp_path: Path) -> None:
    from crewai_core import lock_store

    lock_store.set_lock_backend(locks.backend(str(tmp_path)))
    try:
        with lock_store.lock("sqlite:/a/b.db"):
            named = tmp_path / f"crewai:{md5(b'sqlite:/a/b.db', usedforsecurity=False).hexdigest()}.lock"
            assert named.exists() and not free(named)
    finally:
        lock_store.set_lock_backend(None)
    assert free(named)
