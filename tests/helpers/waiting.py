"""Waiting for a condition with a deadline: for tests, and for test crews inside a worker (no pytest here)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

# How many times slower than the machines the suite's deadlines were chosen on this one runs: scripts/smoke-cgroup2
# sets it for its emulated guest. Deadlines and the job timeouts a test waits out scale by it.
SLOWDOWN = float(os.environ.get("CREW_TEST_SLOWDOWN", "1"))


def wait_until(predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Whether ``predicate`` became true within ``timeout`` seconds (asked every ``interval``, and once more
    at the deadline)."""
    deadline = time.monotonic() + timeout * SLOWDOWN
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
