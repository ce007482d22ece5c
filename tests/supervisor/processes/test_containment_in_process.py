"""A job's boundary in process: what the journal keeps of it, what a restart kills from it, what the Landlock rules
leave writable, what a job's places count as written. Real processes and files, no supervisor."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from supervisor.processes.containment import Boundary, kill_remains
from supervisor.processes.held import unnamed_files
from supervisor.processes.places import MAX_NEW_ENTRIES, Places, Reading
from tests.conftest import ROOT, gone, wait_until
from worker.landlock import allowed_around


def test_a_boundary_survives_the_journal_and_a_malformed_one_is_empty() -> None:
    boundary = Boundary(("/sys/fs/cgroup/pids/crew-supervisor-1/worker-2-3.00",), ((12, 34.5),))
    assert Boundary.decode(boundary.encode()) == boundary
    for raw in (None, b"", b"not json", b"[1, 2]", b'{"tree": [[1]]}', b'{"cgroups": 5}'):
        assert Boundary.decode(raw) == Boundary()


def test_a_restart_kills_the_sampled_tree_by_pid_and_start_time_never_a_reused_pid() -> None:
    left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        started = psutil.Process(left.pid).create_time()
        other = psutil.Process(bystander.pid).create_time()
        # The worker long gone (no pid), its group empty: only what a sample saw names them.
        boundary = Boundary(tree=((left.pid, started), (bystander.pid, other - 100)))
        killed = kill_remains(None, None, None, boundary)
        assert [process.pid for process in killed] == [left.pid]
        assert wait_until(lambda: left.poll() is not None and gone(left.pid), timeout=10)
        assert bystander.poll() is None, "a process whose start time differs is another's"
    finally:
        for process in (left, bystander):
            process.kill()
            process.wait()


def test_a_journal_naming_a_cgroup_not_a_jobs_is_not_read() -> None:
    """The root cgroup lists every process: a journal is data, and only a job cgroup of ours names members."""
    assert kill_remains(None, None, None, Boundary(cgroups=("/sys/fs/cgroup/pids",))) == []


def test_landlock_rules_cover_everything_but_the_denied_places(tmp_path: Path) -> None:
    for directory in ("a/b/c", "a/d", "e"):
        (tmp_path / directory).mkdir(parents=True)
    (tmp_path / "f").write_text("")
    (tmp_path / "link").symlink_to(tmp_path / "a" / "b")
    allowed = set(allowed_around({str(tmp_path / "a" / "b")}, str(tmp_path)))
    assert allowed == {str(tmp_path / "a" / "d"), str(tmp_path / "e"), str(tmp_path / "f")}  # no rule through the link


def test_places_count_all_of_scratch_and_what_kept_places_grew_by(tmp_path: Path) -> None:
    scratch, home = tmp_path / "scratch", tmp_path / "home"
    scratch.mkdir()
    home.mkdir()
    (home / "before").write_bytes(b"x" * 1_000_000)
    for number in range(MAX_NEW_ENTRIES + 5):  # a crew's cache: not the job's, however large
        (home / f"cached-{number}").touch()
    places = Places(scratch, (home,))
    assert 1_000_000 <= asyncio.run(places.begin()) < 1_100_000  # what the crew's places held before the job: not its
    assert dataclasses.replace(places.measure(), crew=0) == Reading()  # nothing of its own yet
    (scratch / "a").write_bytes(b"x" * 300_000)
    (home / "b").write_bytes(b"x" * 200_000)
    for name in ("c", "d"):  # more names of one file: counted once
        (home / name).hardlink_to(home / "b")
    reading = places.measure()
    assert 500_000 <= reading.written < 600_000 and reading.entries == 4  # in blocks on disk
    assert 1_200_000 <= reading.crew < 1_300_000  # the crew's places whole
    for number in range(MAX_NEW_ENTRIES + 5):
        (scratch / f"many-{number}").touch()
    assert places.measure().entries > MAX_NEW_ENTRIES


def test_files_with_no_name_held_open_count_once_whoever_holds_them(tmp_path: Path) -> None:
    """An O_TMPFILE and a file unlinked while open, held by a process and the child it forked (their descriptors
    shared): counted once each; a named file held open is the walk's, not counted here."""
    command = [sys.executable, "-c", HOLDER, str(tmp_path)]
    # Its stderr not pytest's capture, an unlinked file too.
    holder = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        processes = [psutil.Process(holder.pid), *psutil.Process(holder.pid).children()]
        assert len(processes) == 2
        held = unnamed_files(processes)
        assert held.files == 2 and 3 * MiB <= held.bytes < 3 * MiB + 64 * 1024 and held.hidden == (), held
        assert Places(tmp_path / "none", ()).measure(processes).held == held.bytes
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # the child too
        holder.wait()


def test_a_process_that_hides_its_descriptors_is_named_not_passed_over() -> None:
    """Not dumpable, its /proc/<pid>/fd is closed to a supervisor without CAP_SYS_PTRACE (the container's, of the
    workers' uid): the scan, run without capabilities, names it; a dumpable one (capabilities dropped, as a worker
    has them) it reads."""
    hiding, showing = (
        subprocess.Popen([sys.executable, "-c", f"{NO_CAPABILITIES}\n{HOLD}", dumpable], stdout=subprocess.PIPE)
        for dumpable in ("0", "1")
    )
    try:
        for holder in (hiding, showing):
            assert holder.stdout is not None and holder.stdout.readline().strip() == b"holding"
        scan = f"{NO_CAPABILITIES}\n{SCAN}"
        pids = [str(hiding.pid), str(showing.pid)]
        scanned = subprocess.run([sys.executable, "-c", scan, *pids], cwd=ROOT, capture_output=True, check=True)
        assert scanned.stdout.split() == [str(hiding.pid).encode()], scanned
    finally:
        for holder in (hiding, showing):
            holder.kill()
            holder.wait()


NO_CAPABILITIES = """
import ctypes, sys
header, no_capabilities = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()
if ctypes.CDLL(None, use_errno=True).capset(header, no_capabilities) != 0:
    raise OSError(ctypes.get_errno(), "capset")
"""
HOLD = """
import time
ctypes.CDLL(None).prctl(4, int(sys.argv[1]), 0, 0, 0)  # PR_SET_DUMPABLE
print("holding", flush=True)
time.sleep(600)
"""
SCAN = """
import psutil
from supervisor.processes.held import unnamed_files
print(*unnamed_files(map(psutil.Process, map(int, sys.argv[1:]))).hidden)
"""
MiB = 1 << 20
HOLDER = """
import os, sys, time
place = sys.argv[1]
unnamed = os.open(place, os.O_TMPFILE | os.O_WRONLY)
os.write(unnamed, b"x" * (2 << 20))
unlinked = os.open(os.path.join(place, "gone"), os.O_CREAT | os.O_WRONLY)
os.write(unlinked, b"x" * (1 << 20))
os.unlink(os.path.join(place, "gone"))
named = open(os.path.join(place, "named"), "wb")
named.write(b"x" * (1 << 20))
named.flush()
if os.fork() == 0:
    time.sleep(600)
print("holding", flush=True)
time.sleep(600)
"""
