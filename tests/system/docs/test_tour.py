"""The README's main command keeps working: the scripted tour against a real supervisor."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))  # scripts/ is not a package
import tour


def test_the_tour_runs_streams_and_cancels_with_proof_and_leaves_nothing(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # where its state goes: nothing may be left there
    done = subprocess.run(
        [sys.executable, "scripts/tour.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = done.stdout
    assert "without the token: HTTP 401" in out
    # The evidence, not only the verdict: one started event, the same worker pid before and after the repeat.
    assert re.search(
        r"exact repeat returns the same job, no second worker: True"
        r" \(started events' worker pids: \[(\d+)\] after the run, \[\1\] after the repeat\)",
        out,
    ), out
    assert "] completed" in out and "tick 3/" in out
    assert "status: cancelled; proof: stop_confirmed=True signal=SIGKILL" in out
    assert "exists = False" in out
    assert re.search(r"the provider answered 2 call\(s\), streamed: \[True, True\]", out), out
    assert "status: cancelled; stop_confirmed=True" in out
    assert re.search(r"the provider saw its connection closed \d+ ms after the cancel", out), out
    assert re.search(r"its effect ledger: llm [^:;]+: uncertain \(", out), out  # the call the cancel cut off
    assert "done: the supervisor and the provider stopped, and " in out and "is removed (--keep keeps it)" in out
    assert list(tmp_path.iterdir()) == []


def _run(*pids: int) -> list[dict[str, Any]]:
    """A completed demo job's events, with a started event per pid (equal outputs, as the demo always gives)."""
    started = [{"event": "started", "data": {"pid": pid}} for pid in pids]
    return [*started, {"event": "chunk", "data": {}}, {"event": "completed", "data": {"raw": "same"}}]


def test_no_second_worker_is_judged_by_pids_and_started_events_not_by_outputs() -> None:
    assert tour.one_worker(_run(4242), _run(4242))
    assert not tour.one_worker(_run(4242), _run(4343))  # another worker answered the repeat
    assert not tour.one_worker(_run(4242), _run(4242, 4343))  # a second worker started on the same job
    assert not tour.one_worker(_run(4242, 4242), _run(4242, 4242))
    assert not tour.one_worker(_run(), _run())  # no started event: no worker shown at all
