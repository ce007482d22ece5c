"""The disk caps' judgement in process, on real processes and files (no supervisor): whose descriptors a scan reads
and how many, what a process that hides them costs its job, when a job is charged its crew's cap, and when the
first reading after a job's start is taken."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from supervisor import config
from supervisor.processes.held import MAX_DESCRIPTORS, unnamed_files
from supervisor.processes.limits import Limits
from supervisor.processes.places import MEASURE_SECONDS, Places, Reading
from tests.conftest import ROOT
from tests.supervisor.jobs.harness import in_loop
from tests.supervisor.processes.test_containment_in_process import NO_CAPABILITIES

MiB = 1 << 20


def limits(**caps: str) -> Limits:
    environ = {"AIP_CREWAI_REGISTRY": "x:y", "AIP_CREWAI_ALLOW_EPHEMERAL": "true", "AIP_CREWAI_CGROUPS": "off"}
    environ |= {"AIP_CREWAI_ALLOW_UNAUTHENTICATED": "true"}
    return Limits(config.load({}, environ | {f"AIP_CREWAI_{name}": value for name, value in caps.items()}))


@contextlib.contextmanager
def holder(place: Path, dumpable: int = 1, descriptors: int = 0) -> Iterator[subprocess.Popen[bytes]]:
    """A process holding a 1 MiB O_TMPFILE file in ``place`` and ``descriptors`` more on /dev/null, dumpable or
    not, its capabilities dropped (as a worker has them). Its stderr not pytest's capture, an unlinked file too."""
    script = f"{NO_CAPABILITIES}\n{HOLD}"
    process = subprocess.Popen(
        [sys.executable, "-c", script, str(place), str(dumpable), str(descriptors)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == b"holding"
        yield process
    finally:
        process.kill()
        process.wait()


HOLD = """
import os, resource, time
resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
unnamed = os.open(sys.argv[1], os.O_TMPFILE | os.O_WRONLY)
os.write(unnamed, b"x" * (1 << 20))
extra = [os.open(os.devnull, os.O_RDONLY) for _ in range(int(sys.argv[3]))]
ctypes.CDLL(None).prctl(4, int(sys.argv[2]), 0, 0, 0)  # PR_SET_DUMPABLE
print("holding", flush=True)
time.sleep(600)
"""


def test_a_pid_another_process_took_since_the_sample_is_never_read_as_the_jobs(tmp_path: Path) -> None:
    """A supervisor without CAP_SYS_PTRACE saw a process in a sample; it ended, and its pid went to another (forced
    with ns_last_pid) that holds a file with no name and hides its descriptors before the scan: the scan neither
    names it as hiding nor counts what it holds."""
    ended = subprocess.Popen([sys.executable, "-c", UP], stdout=subprocess.PIPE)
    # Its start time is its fork's, in clock ticks: the pid's next holder, forked once it is up, starts later.
    assert ended.stdout is not None and ended.stdout.readline().strip() == b"up"
    scan = f"{NO_CAPABILITIES}\n{SCAN_LATER}"
    scanner = subprocess.Popen(
        [sys.executable, "-c", scan, str(ended.pid)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert scanner.stdout is not None and scanner.stdout.readline().strip() == b"sampled"
        ended.kill()
        ended.wait()
        for _ in range(50):  # another process of the machine may take the pid first: again
            with open("/proc/sys/kernel/ns_last_pid", "w") as last:
                last.write(str(ended.pid - 1))
            with holder(tmp_path, dumpable=0) as taker:
                if taker.pid != ended.pid:
                    continue
                found, _ = scanner.communicate(b"scan\n", timeout=30)
                assert found.split() == [b"0", b"0", b"()"], found  # bytes, files, hidden
                return
        pytest.skip("the ended process's pid was never taken by ours")
    finally:
        scanner.kill()
        scanner.wait()


UP = "import time; print('up', flush=True); time.sleep(600)"
SCAN_LATER = """
import psutil
from supervisor.processes.held import unnamed_files
sampled = psutil.Process(int(sys.argv[1]))
print("sampled", flush=True)
sys.stdin.readline()
held = unnamed_files([sampled])
print(held.bytes, held.files, held.hidden)
"""


def test_a_process_that_hides_its_descriptors_is_named_once_and_breaks_no_cap(tmp_path: Path) -> None:
    """Read by a supervisor without CAP_SYS_PTRACE (the container's): the job's reading names it, in every reading
    after, and its disk cap does not fail the job for it."""
    with holder(tmp_path, dumpable=0) as hiding:
        scan = f"{NO_CAPABILITIES}\n{SCAN}"
        scanned = subprocess.run(
            [sys.executable, "-c", scan, str(tmp_path), str(hiding.pid)], cwd=ROOT, capture_output=True, check=True
        )
        assert scanned.stdout.split() == [str(hiding.pid).encode()] * 2 + [b"None"], scanned


SCAN = """
import psutil
from tests.supervisor.processes.test_disk_caps_in_process import limits
from supervisor.processes.places import Places
places, process = Places(__import__("pathlib").Path(sys.argv[1]), ()), psutil.Process(int(sys.argv[2]))
first = places.measure([process])
print(*first.unreadable, *places.measure().unreadable)
print(limits(WORKER_MAX_DISK_MB="1").disk_breach(first))
"""


def test_descriptors_are_read_only_for_the_jobs_own_cap_and_at_most_so_many_a_scan(tmp_path: Path) -> None:
    with holder(tmp_path, descriptors=300) as many:
        processes = [psutil.Process(many.pid)]
        assert Places(tmp_path / "none", (), held=False).measure(processes).held_files == 0  # CREW_MAX_DISK_MB only
        counted = Places(tmp_path / "none", ()).measure(processes)
        assert counted.held_files == 1 and 300 < counted.descriptors < 400, counted
        capped = unnamed_files(processes, most=100)
        assert capped.descriptors == 101, capped  # it stopped past the cap: the job is stopped for it
    cap = limits(WORKER_MAX_DISK_MB="1024")
    assert cap.disk_breach(counted) is None
    breach = cap.disk_breach(Reading(descriptors=MAX_DESCRIPTORS + 1))
    assert breach is not None and f"over {MAX_DESCRIPTORS} descriptors" in breach.message, breach


def test_the_crew_cap_charges_a_job_only_if_the_crews_places_grew_while_it_ran(tmp_path: Path) -> None:
    """The crew past its cap when the job started (admitted on a stale size): a job that writes nothing there is not
    charged, one that adds to it is."""
    scratch, home = tmp_path / "scratch", tmp_path / "home"
    scratch.mkdir()
    home.mkdir()
    (home / "before").write_bytes(b"x" * 2 * MiB)
    cap = limits(WORKER_MAX_DISK_MB="0", CREW_MAX_DISK_MB="1")
    reader = Places(scratch, (home,))
    asyncio.run(reader.begin())
    assert cap.disk_breach(reader.measure(), after_exit=True) is None
    writer = Places(scratch, (home,))
    asyncio.run(writer.begin())
    (home / "more").write_bytes(b"x" * 4096)
    breach = cap.disk_breach(writer.measure(), after_exit=True)
    assert breach is not None and breach.proof["limit"] == "CREW_MAX_DISK_MB", breach


@in_loop
async def test_the_first_reading_after_the_start_waits_out_the_walk_the_start_took(tmp_path: Path) -> None:
    """``begin`` walked the places as the job started: the sampler's first poll does not walk them again at once,
    the next reading is taken once ``MEASURE_SECONDS`` have passed."""
    places = Places(tmp_path, ())
    await places.begin()
    begun = time.monotonic()
    deadline = begun + MEASURE_SECONDS * 10
    while places.poll(()) is None and time.monotonic() < deadline:
        await asyncio.sleep(0.01)  # a sampler's period
    assert places.reading is not None and time.monotonic() - begun >= MEASURE_SECONDS
