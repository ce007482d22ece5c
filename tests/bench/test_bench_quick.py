"""The benchmark runs end to end (``scripts/bench.py --quick``) and reports every figure.

Benchmarks are measured, not asserted: no timing threshold here, only that each figure exists and is a
positive finite number, and that the bench leaves no supervisor behind.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))  # scripts/ is not a package
from bench_report import FIGURES  # noqa: E402 - every figure the report promises

SAMPLES = [
    *("start_warm", "start_cold"),
    *("cancel_run_warm", "cancel_run_cold", "cancel_replay_warm", "cancel_stubborn_warm"),
]


def left_behind(root: Path) -> list[int]:
    """Processes (supervisors, fork servers, workers) whose state lies under ``root``."""
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.environ().get("AIP_CREWAI_STATE_FILE", "").startswith(str(root)):
                found.append(process.pid)
    return found


@pytest.mark.timeout(300)
def test_quick_bench_reports_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "scripts/bench.py", "--quick", "--json", str(out)],
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(tmp_path)},  # its temporary state, so we can look for leftovers
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    figures = report["figures"]
    for name in FIGURES:
        assert name in figures, name
        value = figures[name]
        assert isinstance(value, int | float) and math.isfinite(value) and value > 0, (name, value)
    for name in SAMPLES:
        assert report["samples_ms"][name], name
    assert {t["figure"] for t in report["targets"]} <= set(figures)
    assert report["meta"]["quick"] is True
    assert left_behind(tmp_path) == []  # every supervisor it started was stopped, with its workers
