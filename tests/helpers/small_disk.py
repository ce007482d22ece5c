"""A small tmpfs for a test to fill or measure (``supervisor.chaos.disk.SmallDisk``), or the test skipped in one line
where none can be mounted (not root, or the kernel refuses)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.chaos.disk import DiskUnavailable, SmallDisk


def mounted(path: Path, size_mb: int) -> Iterator[SmallDisk]:
    """For a fixture to ``yield from``: the tmpfs at ``path`` while the test runs, unmounted after."""
    try:
        small = SmallDisk.mount(path, size_mb)
    except DiskUnavailable as exc:
        pytest.skip(f"no small filesystem: {exc}")
    with small:
        yield small
