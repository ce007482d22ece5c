"""The one rule every script's percentiles follow (scripts/bench_report.py): a q-th percentile only from
enough samples to be more than the maximum (p99 from 100), else the maximum, said as ``max of n``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))  # scripts/ is not a package
from bench_report import LATENCIES, figure_names, latency_figures, quantile_name, quantile_text


@pytest.mark.parametrize(
    ("n", "q", "text"),
    [
        (99, 99, "max of 99: 99.0 ms"),  # one short of a p99: the maximum, and it says so
        (100, 99, "p99 of 100: 99.0 ms"),  # 99.01, interpolated between the 99th and 100th
        (1, 50, "max of 1: 1.0 ms"),
        (2, 50, "p50 of 2: 1.5 ms"),
        (9, 90, "max of 9: 9.0 ms"),
        (10, 90, "p90 of 10: 9.1 ms"),
    ],
)
def test_a_printed_quantile_says_its_n_and_is_the_max_below_enough_samples(n: int, q: int, text: str) -> None:
    assert quantile_text([float(v) for v in range(1, n + 1)], q) == text


def test_latency_figures_name_a_maximum_as_one() -> None:
    ten = [float(v) for v in range(1, 11)]
    assert latency_figures("start_warm", ten) == {
        "start_warm_p50_ms": 5.5,
        "start_warm_p90_ms": pytest.approx(9.1),
        "start_warm_max_ms": 10.0,
    }
    # The journal's medians follow the same rule: one sample is a maximum, not a p50.
    assert latency_figures("journal_0", [4.0]) == {"journal_0_max_ms": 4.0}
    assert quantile_name("journal_10000", 50, 30) == "journal_10000_p50_ms"


def test_figure_names_hold_no_p99_below_100_samples() -> None:
    counts = {name: 1 if name.startswith("journal_") else 99 for name in LATENCIES}
    names = figure_names(counts)
    assert not any(name.endswith("_p99_ms") for name in names)
    assert "start_warm_max_ms" in names and "cancel_run_warm_max_ms" in names and "journal_0_max_ms" in names
    assert "start_warm_p99_ms" in figure_names(counts | {"start_warm": 100})
