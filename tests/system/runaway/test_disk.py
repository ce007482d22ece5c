"""The disk caps against a job that hides what it writes, from inside a real job: files with no name held open count
against ``WORKER_MAX_DISK_MB``, a final accounting after the worker exits counts what it left, and
``CREW_MAX_DISK_MB`` bounds a crew's places across its jobs (a job that takes it past fails; the next start is
refused with 507). The crews are ``tests/crews/hostile.py``'s ``runaway-disk-*``; caps of a few MiB.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.chaos.disk import SmallDisk
from tests.conftest import Server, gone, start_body, start_hostile_server, stop_server, wait_until
from tests.crews.hostile import UNNAMED_FILE_MIB
from tests.helpers.small_disk import mounted

MiB = 1 << 20
DISK_MB = 4  # each file the crews hold is 3 MiB: under it, as RLIMIT_FSIZE requires; two are over it
CREW_DISK_MB = 5  # one of runaway-disk-crew's files fits, two do not
KEY = {"Idempotency-Key": "disk"}


@pytest.fixture(scope="module")
def small_disk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SmallDisk]:
    """The supervisor's state on a tmpfs of its own: its free space says what the job's files took, and gave back."""
    yield from mounted(tmp_path_factory.mktemp("disk") / "tmpfs", 96)


@pytest.fixture(scope="module")
def server(small_disk: SmallDisk, evidence: Path) -> Iterator[Server]:
    running = start_hostile_server(
        small_disk.path / "state", evidence, WORKER_MAX_DISK_MB=str(DISK_MB), CREW_MAX_DISK_MB=str(CREW_DISK_MB)
    )
    yield running
    stop_server(running)  # before the fixture unmounts the disk under it


def failed(server: Server, crew: str, action: str) -> dict[str, object]:
    """Run ``action`` of ``crew`` to its end, which must be a failure: its terminal event's data."""
    with server.client() as client:
        answer = client.post("/jobs", json=start_body(crew, action), headers=KEY)
    assert answer.status_code == 502, answer.text
    return dict(answer.json()["terminal"])


def test_files_with_no_name_held_past_the_cap_stop_the_job_and_are_gone_after(
    server: Server, small_disk: SmallDisk, evidence: Path
) -> None:
    """O_TMPFILE files, each under the cap, 24 MiB together, held open: no name for a walk to find."""
    free_before = small_disk.free_bytes
    terminal = failed(server, "runaway-disk-unnamed", "unnamed")
    assert terminal["error_type"] == "disk_limit_exceeded", terminal
    assert terminal["limit"] == "WORKER_MAX_DISK_MB" and terminal["measured"] == "running", terminal
    assert terminal["limit_bytes"] == DISK_MB * MiB < terminal["held_bytes"] <= terminal["disk_bytes"], terminal
    assert terminal["held_files"] >= 2 and terminal["stop_confirmed"] is True and gone(int(terminal["pid"]))
    assert "files with no name" in str(terminal["message"])
    assert int((evidence / "unnamed.bytes").read_text()) > DISK_MB * MiB  # it held them all before its stop
    # Nobody holds them now: the disk has them back (give or take what the journal and CrewAI wrote).
    assert wait_until(lambda: small_disk.free_bytes > free_before - MiB, timeout=10), (
        free_before,
        small_disk.free_bytes,
    )


def test_a_crew_past_its_cap_fails_the_job_that_took_it_there_and_is_refused_at_admission(server: Server) -> None:
    home = None
    with server.client() as client:
        first = client.post("/jobs", json=start_body("runaway-disk-crew", "crew-1"), headers=KEY)
        assert first.status_code == 200, first.text  # one file: the crew is under its cap

        terminal = failed(server, "runaway-disk-crew", "crew-2")  # a second: over, though the job wrote 3 MiB
        assert terminal["error_type"] == "disk_limit_exceeded", terminal
        assert terminal["limit"] == "CREW_MAX_DISK_MB" and terminal["limit_bytes"] == CREW_DISK_MB * MiB, terminal
        assert terminal["crew_disk_bytes"] > CREW_DISK_MB * MiB, terminal

        refused = client.post("/jobs", json=start_body("runaway-disk-crew", "crew-3"), headers=KEY)
        assert refused.status_code == 507, refused.text
        detail = refused.json()["detail"]
        assert "runaway-disk-crew's HOME and storage hold" in detail and "(CREW_MAX_DISK_MB)" in detail, detail
        assert client.get("/jobs/crew-3").status_code == 404  # refused means not admitted
        other = client.post("/jobs", json=start_body("demo", "other-crew"), headers=KEY)
        assert other.status_code == 200, other.text  # another crew's places are its own

        home = next(Path(server.state).glob("home/*/grow-1")).parent
        for grown in home.glob("grow-*"):  # the operator frees the crew's places: it is let in again
            grown.unlink()
        again = start_body("runaway-disk-crew", "crew-4")
        assert wait_until(lambda: client.post("/jobs", json=again, headers=KEY).status_code == 200, timeout=30)
    for grown in home.glob("grow-*"):
        grown.unlink()


@pytest.fixture(scope="module")
def unsampled(tmp_path_factory: pytest.TempPathFactory, evidence: Path) -> Iterator[Server]:
    """A supervisor whose sampler would not run within a job's life: only the final accounting can see its disk."""
    state = tmp_path_factory.mktemp("unsampled") / "s"
    running = start_hostile_server(state, evidence, WORKER_MAX_DISK_MB=str(DISK_MB), LIMIT_SAMPLE_MS="60000")
    yield running
    stop_server(running)


def test_files_named_in_home_as_the_job_ends_fail_it_at_the_final_accounting(unsampled: Server, evidence: Path) -> None:
    """Two held files, each under the cap, linked into the crew's HOME (kept) just before the job answers."""
    terminal = failed(unsampled, "runaway-disk-linked", "linked")
    with unsampled.client() as client:
        said = client.get("/jobs/linked/output").json()
    assert terminal["error_type"] == "disk_limit_exceeded", (terminal, said)
    assert terminal["measured"] == "after exit" and terminal["answered"] is True, terminal
    assert terminal["exit_status"] == 0 and terminal["held_bytes"] == 0, terminal  # nothing held: it had exited
    assert terminal["disk_bytes"] >= 2 * UNNAMED_FILE_MIB * MiB > terminal["limit_bytes"] == DISK_MB * MiB, terminal
    for linked in Path((evidence / "linked.place").read_text()).glob("linked-*"):
        linked.unlink()
