"""The chaos harness users run (``crew-supervisor chaos``), run here too: 8 supervisor kills under load
with every mid-run fault (workers and the fork server SIGKILLed, the supervisor frozen and thawed, the
journal's disk filled), every invariant checked. Seed 4 schedules each fault at least once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

ITERATIONS = 8


@pytest.mark.timeout(900)
def test_chaos_eight_kills_every_fault_no_violation(tmp_path: Path) -> None:
    faults = ["supervisor", "worker", "forkserver", "freeze"]
    disk = ["--small-disk", "64"] if os.geteuid() == 0 else []  # a tmpfs to fill: root only, as in CI
    if disk:
        faults.append("disk")
    report_path = tmp_path / "report.json"
    command = [sys.executable, "-m", "supervisor", "chaos", "--iterations", str(ITERATIONS), "--seed", "4"]
    command += ["--faults", ",".join(faults), *disk, "--state", str(tmp_path / "run"), "--json", str(report_path)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=880)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    report = json.loads(report_path.read_text())
    assert report["violations"] == []
    assert report["confirmed"]["supervisor"] == ITERATIONS
    assert all(report["confirmed"][name] > 0 for name in faults), report["confirmed"]
    assert report["jobs_admitted"] > 0 and report["jobs_interrupted"] > 0
