"""The chaos harness users run, run here too: 12 supervisor kills under load, every invariant checked."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.timeout(600)
def test_chaos_twelve_kills_without_a_violation() -> None:
    result = subprocess.run(
        [sys.executable, "scripts/chaos.py", "--iterations", "12", "--seed", "7", "--kill-workers"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=590,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "invariant violations                 0" in result.stdout
    assert "supervisor kills                    12" in result.stdout
