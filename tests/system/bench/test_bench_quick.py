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

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))  # scripts/ is not a package
from bench_report import LATENCIES, TARGETS, figure_names  # noqa: E402 - every figure the report promises

# Counts where 0 is a good value: of what went wrong, and of the page faults of a warm loop (its pages reused).
MAY_BE_ZERO = {"llm_wave_incomplete", "inproc_faults"}
DIFFERENCES = {"sandbox_start_cost_ms"}  # one median less another: within noise, of either sign


def left_behind(root: Path) -> list[int]:
    """Processes (supervisors, fork servers, workers) whose state lies under ``root``."""
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.environ().get("AIP_CREWAI_STATE_FILE", "").startswith(str(root)):
                found.append(process.pid)
    return found


@pytest.mark.timeout(480)  # above the run's own deadline, so that one reports with the bench's stderr
def test_quick_bench_reports_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "scripts/bench.py", "--quick", "--json", str(out)],
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(tmp_path)},  # its temporary state, so we can look for leftovers
        capture_output=True,
        text=True,
        timeout=420,  # 60-90 s quiet; a hang guard that holds at load 10 on two cores
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    figures, counts, samples = report["figures"], report["n"], report["samples_ms"]
    assert set(samples) == set(LATENCIES)
    sample_counts = {name: len(values) for name, values in samples.items()}
    assert all(sample_counts.values()), sample_counts
    names = figure_names(sample_counts)
    assert list(figures) == names
    for name in names:
        value = figures[name]
        positive = value > 0 or (name in MAY_BE_ZERO and value == 0) or name in DIFFERENCES
        assert isinstance(value, int | float) and math.isfinite(value) and positive, (name, value)
        n = counts[name]  # every figure says how many samples, jobs or events it comes from
        assert all(isinstance(part, int) and part > 0 for part in (n if isinstance(n, list) else [n])), (name, n)
    # Honest statistics: a p99 only from 100 samples or more, else the maximum ("max of n"); quick has fewer.
    assert "start_warm_max_ms" in figures and "start_warm_p99_ms" not in figures
    assert not any(name.endswith("_p99_ms") for name in figures)
    # Measured counts: the floods' chunk totals are what arrived (quick asks for a known number of each).
    plan = report["meta"]["plan"]
    assert figures["relay_chunks"] == plan["relay_chunks"] * plan["relay_runs"]
    assert figures["flood_chunks"] == figures["inproc_stream_chunks"] == plan["flood_chunks"] * plan["flood_runs"]
    assert counts["jobs_per_s_c4"] == plan["jobs_c4"]
    assert figures["llm_wave_jobs"] == plan["wave"] and counts["llm_job_blocking_p50_ms"] == plan["llm_jobs"]
    # Tracing off and on: as many jobs each side, and every traced job's spans arrived at the loopback receiver.
    for kind in ("job", "llm_job"):
        assert counts[f"{kind}_untraced_p50_ms"] == counts[f"{kind}_traced_p50_ms"] == plan["traced"]
        assert counts[f"{kind}_traced_spans_per_job"] == plan["traced"]
    assert len(report["targets"]) == len(TARGETS)
    assert {t["figure"] for t in report["targets"]} <= set(figures)
    assert report["meta"]["quick"] is True
    assert left_behind(tmp_path) == []  # every supervisor it started was stopped, with its workers
