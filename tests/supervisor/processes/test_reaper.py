"""The reaper: an adopted orphan is reaped, a registered child's exit status is never taken from its watcher."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import psutil
import pytest

from supervisor.processes.launcher import spawn_process
from supervisor.processes.reaper import Reaper
from tests.conftest import wait_until

pytestmark = pytest.mark.usefixtures("subreaper")  # tests/conftest.py: orphans come to us, so gone means reaped


def zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_registered_child_is_left_to_its_watcher() -> None:
    async def scenario() -> int | None:
        reaper = Reaper()
        pid = spawn_process(reaper, ["/bin/sh", "-c", "exit 7"], dict(os.environ), {})
        assert await asyncio.to_thread(wait_until, lambda: zombie(pid))
        reaper.reap()
        assert await reaper.confirm_gone([psutil.Process(pid)], 1.0)  # a zombie is gone, but not reaped
        assert zombie(pid)
        return await asyncio.wait_for(reaper.watch(pid), 5)

    assert asyncio.run(scenario()) == 7


def test_an_adopted_orphan_is_reaped(tmp_path: Path) -> None:
    """The child exits leaving a grandchild, killed with the child's group: our orphan, a zombie until reaped."""
    said = tmp_path / "orphan"

    async def scenario() -> int:
        reaper = Reaper()
        script = f"sleep 60 & echo $! > {said}"
        pid = spawn_process(reaper, ["/bin/sh", "-c", script], dict(os.environ), {})
        assert await asyncio.wait_for(reaper.watch(pid), 5) == 0
        return int(said.read_text())

    orphan = asyncio.run(scenario())
    assert psutil.Process(orphan).ppid() == os.getpid()
    assert wait_until(lambda: zombie(orphan))
    assert Reaper().reap() >= 1
    assert not psutil.pid_exists(orphan)
