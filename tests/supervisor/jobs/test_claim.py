"""The state's claim in process: the lock file's record of who held the state, and the kill of what a gone holder's
job cgroups hold, never what a running holder's directory holds, nor what a process that took a gone holder's pid
started, nor a directory a record merely names, nor a pid its cgroup listed that is no member by the time it is
killed. Real processes, real cgroups (made under this process's own, named after pids of this test's processes),
no supervisor."""

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
from supervisor.processes import cgroups, containment
from supervisor.processes.cgroups import BASE_PREFIX, JOB_PREFIX, PIDS, Cgroups, JobCgroup, holds
from supervisor.processes.containment import Boundary, Containment, kill_remains
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


def _started(process: subprocess.Popen[bytes]) -> float:
    return psutil.Process(process.pid).create_time()


def _sleeper_after(earlier: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
    """A sleeper whose start time is later than ``earlier``'s (start times count in clock ticks)."""
    tried: list[subprocess.Popen[bytes]] = []

    def later() -> bool:
        tried.append(_sleeper())
        return _started(tried[-1]) > _started(earlier)

    found = wait_until(later, timeout=10)
    for process in tried[:-1] if found else tried:
        process.kill()
        process.wait()
    assert found, "no process started a clock tick after another"
    return tried[-1]


def _job_cgroup(parent: Path, pid: int, member: int, name: str = "test") -> Path:
    """A job cgroup in the directory a supervisor of ``pid`` would make, with ``member`` moved into it."""
    job = parent / f"{BASE_PREFIX}{pid}" / f"{JOB_PREFIX}{name}"
    job.mkdir(parents=True)
    (job / "cgroup.procs").write_text(str(member))
    return job


@contextlib.contextmanager
def _cleaned(processes: list[subprocess.Popen[bytes]], made: list[Path]) -> Iterator[None]:
    """This test's processes killed and its cgroups removed, whatever the test did (nothing else's is touched)."""
    try:
        yield
    finally:
        for process in processes:
            process.kill()
            process.wait()
        for job in made:
            for directory in (job, job.parent):
                with contextlib.suppress(OSError):
                    directory.rmdir()


def test_only_a_gone_holders_own_job_cgroups_are_emptied(cgroup_parent: Path) -> None:
    ended = subprocess.Popen(["true"])
    ended.wait()  # a supervisor that died: no process has its pid now
    live, left, bystander = _sleeper(), _sleeper(), _sleeper()
    made: list[Path] = []
    with _cleaned([live, left, bystander], made):
        made.append(dead_job := _job_cgroup(cgroup_parent, ended.pid, left.pid))
        made.append(live_job := _job_cgroup(cgroup_parent, live.pid, bystander.pid))
        holders = [
            Holder(ended.pid, 1.0, (str(dead_job.parent),)),
            Holder(live.pid, _started(live), (str(live_job.parent),)),  # it runs: its directory is never read
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


def test_a_pid_another_process_took_is_no_live_holder_and_only_what_started_before_it_is_killed(
    cgroup_parent: Path,
) -> None:
    """The record's start time tells the holder from a process that took its pid after it died; that one may be a
    supervisor of another state, whose directory is named the same: what it started is spared, as is its directory."""
    left = _sleeper()  # a dead supervisor's job left it
    taker = _sleeper_after(left)  # took the dead supervisor's pid: a supervisor of another state, say
    own = _sleeper()  # a job of the taker's, in the same directory
    made: list[Path] = []
    with _cleaned([left, taker, own], made):
        made.append(dead_job := _job_cgroup(cgroup_parent, taker.pid, left.pid, "dead"))
        made.append(own_job := _job_cgroup(cgroup_parent, taker.pid, own.pid, "own"))
        made.append(joining := dead_job.parent / f"{JOB_PREFIX}joining")
        joining.mkdir()  # one of the taker's, made a moment before its worker moves in: still empty
        base = str(dead_job.parent)
        assert Holder(taker.pid, _started(left) - 1, (base,)).left()  # gone, and its cgroups hold a process
        assert not Holder(taker.pid, _started(taker), (base,)).left()  # the holder itself runs
        assert kill_left_in_cgroups([Holder(taker.pid, _started(taker), (base,))]) == {}
        killed = kill_left_in_cgroups([Holder(taker.pid, _started(left) - 1, (base,))])
        assert {path: [process.pid for process in processes] for path, processes in killed.items()} == {
            str(dead_job): [left.pid],
            str(joining): [],
            str(own_job): [],
        }
        assert wait_until(lambda: left.poll() is not None and gone(left.pid), timeout=10)
        assert taker.poll() is None and own.poll() is None
        assert joining.exists() and own_job.exists()  # nothing of the taker's directory is removed under it


def test_a_pid_its_cgroup_listed_is_killed_only_while_still_a_member(
    cgroup_parent: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cgroup.procs`` read, then a member ends and a stranger takes its pid before the kill: the stranger, once
    identified, is no member (``/proc/<pid>/cgroup`` names another cgroup), so neither the restart's kill nor a live
    job's takes it. The read is made stale by hand: the kernel gives no way to time that race."""
    worker, member, stranger = _sleeper(), _sleeper(), _sleeper()  # the stranger no child of the worker
    made: list[Path] = []
    with _cleaned([worker, member, stranger], made):
        made.append(job := _job_cgroup(cgroup_parent, os.getpid(), member.pid))
        assert holds(job, member.pid) and not holds(job, stranger.pid)
        real = cgroups.members_of

        def stale(path: Path) -> list[int]:  # the stranger listed as if a member that ended had its pid
            return [*real(path), stranger.pid] if path == job and member.poll() is None else real(path)

        monkeypatch.setattr(cgroups, "members_of", stale)
        monkeypatch.setattr(containment, "members_of", stale)
        live = Containment(worker.pid, _started(worker), JobCgroup({PIDS: (job, True)}))
        assert [process.pid for process in live.descendants()] == [member.pid]
        killed = kill_remains(None, None, None, Boundary((str(job),)))
        assert [process.pid for process in killed] == [member.pid]
        assert wait_until(lambda: member.poll() is not None, timeout=10)
        assert stranger.poll() is None


def test_a_supervisor_that_stops_with_a_process_left_in_its_job_cgroups_stays_in_the_record(
    cgroup_parent: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The journal says its jobs ended: only the record still leads the next start to what they left."""
    journal = tmp_path / "journal.db"
    base = cgroup_parent / f"{BASE_PREFIX}{os.getpid()}"  # the fixture's own directory: ours
    left = _sleeper()
    made: list[Path] = []
    with _cleaned([left], made):
        made.append(job := _job_cgroup(cgroup_parent, os.getpid(), left.pid))
        claim = Claim(journal)
        claim.hold((str(base),))
        claim.release()
        assert "a process is left in this supervisor's job cgroups" in caplog.text
        us = Holder(os.getpid(), psutil.Process().create_time(), (str(base),))
        claim = Claim(journal)
        assert claim.before == [us]  # the lock let go; whoever takes it next finds what we left
        left.kill()
        left.wait()
        assert wait_until(lambda: not cgroups.members_of(job), timeout=10)
        claim.hold((str(base),))
        claim.release()
        assert Claim(journal).before == []  # nothing left: nothing to look for
