"""Nothing of a job outlives it: a family of processes (``tests/helpers/family.py``: a child in the worker's group, a
setsid grandchild, a grandchild that tries to join the root cgroups, a child in a group of its own) is killed
whichever way its job ends, and by the next supervisor when the one that ran it was SIGKILLed (with its fork
server, or alone). psutil checks that each member is gone, and the evidence counts them."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import NamedTuple

import psutil
import pytest

from supervisor.testing import Server
from tests.conftest import gone, start_body, start_server, wait_until
from tests.crews.base import EVIDENCE_DIR, FAMILY
from tests.helpers.family import ROLES
from tests.helpers.waiting import SLOWDOWN

pytestmark = pytest.mark.usefixtures("subreaper")  # orphans of a killed supervisor come to us: gone means reaped
KEY = {"Idempotency-Key": "key"}
# As root on cgroup v1 (this project's VM and CI), a job has a cgroup of its own. On v2 it depends on where the
# supervisor's cgroup sits, so only scripts/smoke-cgroup2, which makes both layouts that allow it, asks for it.
CGROUPS = Path("/sys/fs/cgroup")
CGROUP_PER_JOB = os.geteuid() == 0 and (
    (CGROUPS / "pids/cgroup.procs").exists() or os.environ.get("CREW_TEST_CGROUP2") == "1"
)


class Member(NamedTuple):
    pid: int
    create_time: float
    said: str

    def gone(self) -> bool:
        return gone(self.pid, self.create_time)


def family_of(evidence: Path) -> dict[str, Member]:
    """Each member the job started, by role: its pid and start time, and what it said."""
    members = {}
    for line in (evidence / FAMILY).read_text().splitlines():
        role, pid, started, *said = line.split()
        members[role] = Member(int(pid), float(started), " ".join(said))
    assert sorted(members) == sorted(ROLES), members
    return members


def started_family(server: Server, evidence: Path, action: str, crew: str = "family-block") -> dict[str, Member]:
    """Start a job of ``crew`` (a family that blocks) without waiting for it; its family once all four said so."""
    body, key = start_body(crew, action), {"Idempotency-Key": action}
    with server.client() as client, client.stream("POST", "/jobs/stream", json=body, headers=key) as response:
        assert "event: started" in response.iter_lines()  # hanging up then never cancels the job
    assert wait_until(lambda: (evidence / FAMILY).exists() and len((evidence / FAMILY).read_text().split("\n")) > 4)
    return family_of(evidence)


def made_for_jobs(supervisor: int) -> list[Path]:
    """The directories of job cgroups ``supervisor`` made, beside its own cgroup in each hierarchy."""
    found = []
    for line in Path(f"/proc/{supervisor}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        relative = "" if path == "/init" and not controllers else path.lstrip("/")  # v2: a namespace's leaf
        found.append(CGROUPS / controllers / relative / f"crew-supervisor-{supervisor}")
    return [path for path in found if path.is_dir()]


def assert_all_gone(members: dict[str, Member]) -> None:
    for role, member in members.items():
        assert wait_until(member.gone, timeout=10), role


@pytest.fixture
def evidence(tmp_path: Path) -> Path:
    place = tmp_path / "evidence"
    place.mkdir()
    return place


@pytest.fixture
def family_server(tmp_path: Path, evidence: Path) -> Server:
    env = {EVIDENCE_DIR: str(evidence), "AIP_CREWAI_LIMIT_SAMPLE_MS": "50"}
    return start_server(tmp_path / "state", env=env)


def test_the_escaper_cannot_leave_its_cgroups(family_server: Server, evidence: Path) -> None:
    """Denied by the kernel (Landlock), as root too: a job cannot write any cgroup file."""
    with family_server.client() as client:
        answer = client.post("/jobs", json=start_body("family-answer", "escape"), headers=KEY)
        health = client.get("/health").json()
        record = client.get("/jobs/escape").json()
    members = family_of(evidence)
    said = members["escaper"].said  # the cgroup files refused by Landlock; clone3 into a v2 cgroup by seccomp
    assert said.startswith("denied:") and "EACCES" in said and "ENOSYS" in said, said
    if CGROUP_PER_JOB:  # which no worker can leave
        assert health["containment"] == "cgroup", health
    # It answered, and left four processes running: its answer stands; each is killed, counted and named.
    assert answer.status_code == 200 and answer.json()["raw"] == "the family is started", answer.text
    leftovers = record["leftovers"]
    assert leftovers["descendants_killed"] == 4 and leftovers["stop_confirmed"] is True, record
    ways = {process["pid"]: process["left"] for process in leftovers["processes"]}
    expected = {"child": "in_group", "setsid": "own_session", "escaper": "in_group", "mover": "own_group"}
    assert ways == {members[role].pid: left for role, left in expected.items()}, leftovers
    assert_all_gone(members)


@pytest.mark.parametrize("end", ["cancel", "timeout", "raise"])
def test_each_way_a_job_ends_kills_its_whole_family(family_server: Server, evidence: Path, end: str) -> None:
    with family_server.client() as client:
        if end == "raise":
            answer = client.post("/jobs", json=start_body("family-raise", "end"), headers=KEY)
            terminal = answer.json()["terminal"]
        elif end == "timeout":
            # The family starts first: four processes, one after another (seconds at load), then it blocks.
            body = start_body("family-block", "end", timeout_ms=int(8000 * SLOWDOWN))
            terminal = client.post("/jobs", json=body, headers=KEY, timeout=60 * SLOWDOWN).json()["terminal"]
        else:
            members = started_family(family_server, evidence, "end")
            cancel = client.post("/jobs/end/cancel", json={"crew_id": "family-block", "action_id": "end"})
            terminal = cancel.json()["terminal"]
    members = family_of(evidence)
    expected = {"cancel": "cancelled", "timeout": "failed", "raise": "failed"}[end]
    assert terminal["status"] == expected, terminal
    assert terminal["stop_confirmed"] is True and terminal["descendants_killed"] == 4, terminal
    assert_all_gone(members)


@pytest.mark.parametrize("with_forkserver", [False, True], ids=["supervisor", "supervisor-and-forkserver"])
def test_a_restart_kills_what_a_dead_supervisors_job_left(
    tmp_path: Path, evidence: Path, with_forkserver: bool
) -> None:
    """SIGKILL the supervisor (and its fork server): the worker dies by its death signal, its family lives on
    (orphans, and members of the dead supervisor's cgroups). The next supervisor on the state kills every one
    before it serves, names them on the fenced job and removes the dead supervisor's cgroups."""
    state = tmp_path / "state"
    env = {EVIDENCE_DIR: str(evidence)}
    first = start_server(state, env=env)
    members = started_family(first, evidence, "left")
    forkserver = [child for child in psutil.Process(first.pid).children() if "forkserver" in " ".join(child.cmdline())]
    cgroups = made_for_jobs(first.pid)
    assert cgroups or not CGROUP_PER_JOB
    for process in [*forkserver[:with_forkserver], psutil.Process(first.pid)]:
        process.send_signal(signal.SIGKILL)
    assert wait_until(lambda: gone(first.pid), timeout=10)
    assert not any(member.gone() for member in members.values()), "the family should outlive its supervisor"

    second = start_server(state, env=env)
    for role, member in members.items():  # gone before the new supervisor answered /health
        assert member.gone(), role
    with second.client() as client:
        terminal = client.get("/jobs/left").json()["terminal"]
    assert terminal["reason"] == "supervisor_restarted" and terminal["orphan_killed"] is True, terminal
    assert terminal["orphans_killed"] == 4
    assert sorted(terminal["orphan_pids"]) == sorted(member.pid for member in members.values())
    assert not any(cgroup.exists() for cgroup in cgroups), cgroups
