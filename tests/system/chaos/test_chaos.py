"""The chaos harness users run (``crew-supervisor chaos``), run here too: 8 supervisor kills under load
with every mid-run fault (workers and the fork server SIGKILLed, the supervisor frozen and thawed, the
journal's disk filled), every invariant checked. Seed 4 schedules each fault at least once. Its slow jobs
start a family of processes each (``family-slow`` in tests/crews/base.py: a child, a setsid grandchild, one that
tries to leave its cgroups, one in a group of its own), which no kill may leave alive."""

from __future__ import annotations

import json
import os
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from supervisor import testing
from tests.conftest import ROOT

ITERATIONS = 8


ROOT_ONLY = os.geteuid() == 0  # the disk fault fills a tmpfs it mounts: root only (CI is)
CORE = ["supervisor", "worker", "forkserver", "freeze"]


@pytest.fixture(scope="module")
def eight_kills(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One seeded run of 8 iterations with every fault this machine allows (the disk's only as root)."""
    root = tmp_path_factory.mktemp("chaos")
    faults, disk = [*CORE, *(["disk"] if ROOT_ONLY else [])], (["--small-disk", "64"] if ROOT_ONLY else [])
    report_path = root / "report.json"
    command = [sys.executable, "-m", "supervisor", "chaos", "--iterations", str(ITERATIONS), "--seed", "4"]
    command += ["--faults", ",".join(faults), *disk, "--state", str(root / "run"), "--json", str(report_path)]
    command += ["--registry", "tests.crews:registry", "--slow-crew", "family-slow"]
    # Offline crews: each restart warms for them alone. The registry is in this tree, as are its workers' family.
    env = {**os.environ, "AIP_CREWAI_WARMUP": "offline", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=880)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return dict(json.loads(report_path.read_text()))


@pytest.mark.timeout(900)
def test_chaos_eight_kills_every_fault_no_violation(eight_kills: dict[str, Any]) -> None:
    report = eight_kills
    assert report["violations"] == []
    assert report["confirmed"]["supervisor"] == ITERATIONS
    assert all(report["confirmed"][name] > 0 for name in CORE), report["confirmed"]
    assert report["jobs_admitted"] > 0 and report["jobs_interrupted"] > 0


@pytest.mark.timeout(900)
def test_chaos_fills_the_disk_too_where_it_can(eight_kills: dict[str, Any]) -> None:
    """Apart, so that a machine where it cannot run says so in the summary instead of passing without it."""
    if not ROOT_ONLY:
        assert "disk" in eight_kills["faults_not_run"]  # and the report says so too
        pytest.skip("the disk fault needs root (it mounts a tmpfs to fill): not run here")
    assert eight_kills["confirmed"]["disk"] > 0 and "disk" not in eight_kills["faults_not_run"]


def deployment_chaos(tmp_path: Path, iterations: int, restart: list[str]) -> tuple[int, dict[str, Any], str]:
    """Chaos against a supervisor it did not start (tests/helpers/deployment.py), by URL and restart command."""
    place, port = tmp_path / "deployment", testing.free_port()
    helper = [sys.executable, "-m", "tests.helpers.deployment"]
    subprocess.run([*helper, "start", str(place), str(port)], cwd=ROOT, check=True, timeout=300)
    try:
        report_path = tmp_path / "report.json"
        restart_cmd = shlex.join([*helper, "restart", str(place), str(port), *restart])
        command = [sys.executable, "-m", "supervisor", "chaos", "--url", f"http://127.0.0.1:{port}"]
        command += ["--token-file", str(place / "token"), "--restart-cmd", restart_cmd, "--faults", "supervisor"]
        command += ["--iterations", str(iterations), "--seed", "1", "--json", str(report_path)]
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
        return result.returncode, json.loads(report_path.read_text()), result.stdout + result.stderr
    finally:
        subprocess.run([*helper, "kill", str(place)], cwd=ROOT, check=True, timeout=60)


@pytest.mark.timeout(900)
def test_chaos_against_a_deployment_by_url_and_restart_command(tmp_path: Path) -> None:
    code, report, output = deployment_chaos(tmp_path, 2, [])
    assert code == 0, output[-4000:]
    assert report["violations"] == [] and report["confirmed"] == {"supervisor": 2}
    assert report["jobs_admitted"] > 0  # and each restart was confirmed by a new instance (above)
    assert report["not_checked"]  # what it could not see is said, not passed over


@pytest.mark.timeout(900)
def test_chaos_catches_a_deployment_that_loses_its_journal(tmp_path: Path) -> None:
    code, report, output = deployment_chaos(tmp_path, 1, ["--lose-journal"])
    assert code == 1, output[-4000:]
    assert any("is missing (404)" in violation for violation in report["violations"]), report["violations"]


@pytest.mark.timeout(600)
def test_chaos_counts_a_crew_that_leaves_processes_behind_as_the_crews_own(tmp_path: Path) -> None:
    """Every job of ``family-answer`` that answers leaves four processes running (tests/helpers/family.py), as a crew
    that does not close its MCP stdio server or code interpreter does: its answers stand, what it left is killed and
    named, and none of it is a violation. The load's own jobs may all end before their answer (a cancel, a worker
    kill, the stop: a loaded machine lets none finish in a short iteration); the run's baseline, one job of each of
    its two crews run to its end before the load, answers whatever the machine's speed."""
    report_path = tmp_path / "report.json"
    command = [sys.executable, "-m", "supervisor", "chaos", "--iterations", "1", "--seed", "4"]
    command += ["--faults", "worker,freeze", "--state", str(tmp_path / "run"), "--json", str(report_path)]
    command += ["--registry", "tests.crews:registry", "--fast-crew", "family-answer", "--slow-crew", "family-answer"]
    env = {**os.environ, "AIP_CREWAI_WARMUP": "offline", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=580)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    report = json.loads(report_path.read_text())
    assert report["violations"] == [] and report["requests"]["baseline starts"] == 2, report
    assert report["jobs_that_left_processes"] >= 2, report


@pytest.mark.timeout(600)
def test_chaos_as_typed_runs_its_default_faults_and_leaves_nothing(tmp_path: Path) -> None:
    """No --faults, no --state: the faults that need nothing but us, in a temporary directory removed after."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    command = [sys.executable, "-m", "supervisor", "chaos", "--iterations", "1", "--seed", "4"]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=580)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "fault not run: disk: not chosen: it needs --small-disk MB" in result.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.timeout(600)
def test_chaos_runs_crews_that_need_inputs_given_as_flags(tmp_path: Path) -> None:
    """The registry of docs/your-crews.md: each crew fails without its input, so every job that completes
    had the one the flags gave (a failure no fault explains would be a violation)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "docs/examples"), "MY_CREWS_OFFLINE": "1"}
    command = [
        sys.executable,
        "-m",
        "supervisor",
        "chaos",
        "--iterations",
        "1",
        "--seed",
        "4",
        "--faults",
        "supervisor",
    ]
    command += ["--registry", "my_crews:registry", "--state", str(tmp_path / "run")]
    command += ["--fast-crew", "research", "--fast-input", '{"topic": "queues"}', "--slow-crew", "watch"]
    command += ["--slow-input", '{"topic": "queues", "seconds": {seconds}}']
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=580)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    # How many jobs finish before the kill depends on the load; that none failed as a crew missing its input
    # does not (it would also be a violation), among jobs that began (their `started` event came).
    journal = sqlite3.connect(f"file:{tmp_path / 'run/state/journal.db'}?mode=ro", uri=True)
    began = journal.execute("SELECT count(DISTINCT action_id) FROM events WHERE event = 'started'").fetchone()[0]
    crew_errors = journal.execute("SELECT count(*) FROM events WHERE data LIKE '%operation_failed%'").fetchone()[0]
    assert began > 0 and crew_errors == 0, (began, crew_errors)
