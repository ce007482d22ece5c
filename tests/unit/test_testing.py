"""The harness itself (supervisor/testing.py), without starting a server: it stays light and refuses typos."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from supervisor import testing


def test_importing_the_harness_imports_neither_crewai_nor_the_worker() -> None:
    code = "import sys, supervisor.testing; print(sorted({m.split('.')[0] for m in sys.modules} & {'crewai','worker'}))"
    imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert imported.stdout.strip() == "[]"


def test_an_unknown_setting_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="AIP_CREWAI_MAX_CONCURENCY"):
        testing.start(tmp_path / "state", "tests.crews:registry", max_concurency=2)
    assert list(tmp_path.iterdir()) == []
