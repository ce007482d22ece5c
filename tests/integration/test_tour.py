"""The README's main command keeps working: the scripted tour against a real supervisor."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def test_the_tour_runs_streams_and_cancels_with_proof() -> None:
    tour = subprocess.run([sys.executable, "scripts/tour.py"], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert tour.returncode == 0, tour.stdout[-2000:] + tour.stderr[-2000:]
    out = tour.stdout
    assert "without the token: HTTP 401" in out
    assert "exact repeat returns the same job, no second worker: True" in out
    assert "] completed" in out and "tick 3/" in out
    assert "status: cancelled; proof: stop_confirmed=True signal=SIGKILL" in out
    assert "exists = False" in out
    assert "done: the supervisor stopped" in out
