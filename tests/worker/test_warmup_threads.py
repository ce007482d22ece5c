"""The warm-up's thread check (``worker.warmup``): a thread it left behind is found, native ones too."""

from __future__ import annotations

import _thread
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from worker import warmup


@pytest.fixture
def native_thread() -> Iterator[str]:
    """A running thread Python does not list (started by ``_thread``, as a C library starts its own): its task id."""
    started, release = _thread.allocate_lock(), _thread.allocate_lock()
    started.acquire()
    release.acquire()
    tid: list[int] = []

    def park() -> None:
        tid.append(threading.get_native_id())  # registers nothing with threading
        started.release()
        release.acquire()

    _thread.start_new_thread(park, ())
    try:
        assert started.acquire(timeout=10)
        yield str(tid[0])
    finally:
        release.release()


def unknown(task: str) -> list[str]:
    """What the check says of one thread Python does not know: with the kernel's name for it."""
    name = Path(f"/proc/self/task/{task}/comm").read_text().strip()
    return [f"1 thread(s) unknown to Python ({name})"]


@pytest.fixture(autouse=True)
def _short_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(warmup, "SETTLE_SECONDS", 0.2)  # the check waits this long for threads that are ending


def test_the_threads_there_before_pass(native_thread: str) -> None:
    assert native_thread not in {str(thread.native_id) for thread in threading.enumerate()}
    assert warmup._other_threads(warmup.Threads.now()) == []


def test_a_native_thread_left_behind_is_found(native_thread: str) -> None:
    now = warmup.Threads.now()
    before = warmup.Threads(now.python, now.kernel - {native_thread})
    assert warmup._other_threads(before) == unknown(native_thread)


def test_a_thread_of_the_baseline_that_ended_does_not_hide_a_new_one(native_thread: str) -> None:
    now = warmup.Threads.now()
    ended = "0"  # no task has id 0: a thread that was there at the baseline and has ended since
    before = warmup.Threads(now.python, now.kernel - {native_thread} | {ended})
    assert warmup._other_threads(before) == unknown(native_thread)
