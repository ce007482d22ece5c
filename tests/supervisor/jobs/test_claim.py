"""The state's claim in process: the lock file's record of who held the state, and the kill of what a gone holder's
job cgroups hold, never what a live pid's directory holds nor a directory a record merely names. Real processes,
real cgroups (made under this process's own, named after pids of this test's processes), no supervisor."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import orjson
import psutil
import pytest

from supervisor.jobs.claim import Claim, Holder
from supervisor.jobs.fencing import kill_left_in_cgroups
from supervisor.journal.errors import JournalLocked
from supervisor.processes.cgroups import BASE_PREFIX, JOB_PREFIX, PIDS, Cgroups
from tests.conftest import gone, wait_until


def test_the_record_names_the_holder_until_a_clean_close(tmp_path: Path) -> None:
    journal = tmp_path / "journal.db"
    claim = Claim(journal)
    assert claim.before == []
    claim.hold(("/sys/fs/cgroup/pids/crew-supervisor-1",))
    with pytest.raises(JournalLocked):
        Claim(journal)  # a second supervisor: refused before it reads, let alone kills, anything
    record = orjson.loads(journal.with_name("journal.db.lock").read_bytes())
    started = psutil.Process().create_time()
    assert record == [{"pid": os.getpid(), "started": started, "cgroups": ["/sys/fs/cgroup/pids/crew-supervisor-1"]}]
    claim.release()
    claim.release()  # idempotent, as the exit stack may call it
    assert Claim(journal).before == []  # every job of ours ended: nothing left to look for


def test_a_malformed_record_is_none(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    journal = tmp_path / "journal.db"
    for raw in (b"not json", b'{"pid": 1}', b'[{"pid": "x"}]', b"[1]"):
        journal.with_name("journal.db.lock").write_bytes(raw)
        claim = Claim(journal)
        assert claim.before == []
        claim.release()
    assert "the record in the journal's lock file cannot be read" in caplog.text


@pytest.fixture
def cgroup_parent() -> Iterator[Path]:
    """Where this process's job cgroups would go: the parent of its own pids directory (none: skipped)."""
    ours = Cgroups.find([PIDS])
    if ours is None:
        pytest.skip("no pids cgroup this process can write")
    try:
        yield ours.controllers[0].base.parent
    finally:
        ours.remove()


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "600"])


def _job_cgroup(parent: Path, pid: int, member: int) -> Path:
    """A job cgroup in the directory a supervisor of ``pid`` would make, with ``member`` moved into it."""
    job = parent / f"{BASE_PREFIX}{pid}" / f"{JOB_PREFIX}test"
    job.mkdir(parents=True)
    (job / "cgroup.procs").write_text(str(member))
    return job


def test_only_a_gone_holders_own_job_cgroups_are_emptied(cgroup_parent: Path) -> None:
    ended = subprocess.Popen(["true"])
    ended.wait()  # a supervisor that died: no process has its pid now
    live, left, bystander = _sleeper(), _sleeper(), _sleeper()
    made = []
    try:
        made.append(dead_job := _job_cgroup(cgroup_parent, ended.pid, left.pid))
        # A live pid (a supervisor of another state that reused it) names its directory the same: never read.
        made.append(live_job := _job_cgroup(cgroup_parent, live.pid, bystander.pid))
        holders = [
            Holder(ended.pid, 1.0, (str(dead_job.parent),)),
            Holder(live.pid, 1.0, (str(live_job.parent),)),
            Holder(ended.pid, 1.0, (str(live_job.parent),)),  # a record naming another's directory as its own
            Holder(ended.pid, 1.0, (str(cgroup_parent),)),  # or one that is no supervisor's directory at all
        ]
        killed = kill_left_in_cgroups(holders)
        assert {path: [process.pid for process in processes] for path, processes in killed.items()} == {
            str(dead_job): [left.pid]
        }
        assert wait_until(lambda: left.poll() is not None and gone(left.pid), timeout=10)
        assert not dead_job.exists() and not dead_job.parent.exists()  # emptied, then removed
        assert bystander.poll() is None and live.poll() is None
    finally:
        for process in (live, left, bystander):
            process.kill()
            process.wait()
        for job in made:
            for directory in (job, job.parent):
                with contextlib.suppress(OSError):
                    directory.rmdir()
