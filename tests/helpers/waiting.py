"""Waiting for a condition with a deadline: for tests, and for test crews inside a worker (no pytest here)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Whether ``predicate`` became true within ``timeout`` seconds (asked every ``interval``, and once more
    at the deadline)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
