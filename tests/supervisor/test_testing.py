"""The harness itself (supervisor/testing.py), without starting a server: it stays light and refuses typos."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from supervisor import testing
from tests.conftest import gone, wait_until


def test_importing_the_harness_imports_neither_crewai_nor_the_worker() -> None:
    code = "import sys, supervisor.testing; print(sorted({m.split('.')[0] for m in sys.modules} & {'crewai','worker'}))"
    imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert imported.stdout.strip() == "[]"


def test_loading_the_pytest_plugin_imports_neither_the_server_nor_the_harness() -> None:
    # It loads in every pytest session of its user: nothing heavy until a fixture starts a supervisor.
    heavy = ["crewai", "worker", "fastapi", "uvicorn", "httpx", "psutil", "supervisor.testing"]
    code = f"import sys, supervisor.pytest_plugin; print([m for m in {heavy} if m in sys.modules])"
    imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert imported.stdout.strip() == "[]"


def test_an_unknown_setting_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="AIP_CREWAI_MAX_CONCURENCY"):
        testing.start(tmp_path / "state", "tests.crews:registry", max_concurency=2)
    assert list(tmp_path.iterdir()) == []


def fake_server(tmp_path: Path, script: str) -> testing.Server:
    """A shell in the supervisor's place, with a ``sleep`` as its only worker."""
    process = subprocess.Popen(["sh", "-c", script])
    server = testing.Server(process, "http://127.0.0.1:9", "token", tmp_path / "state", tmp_path / "log")
    assert wait_until(server.processes)
    return server


def test_shut_down_names_and_kills_a_process_that_outlived_its_server(tmp_path: Path) -> None:
    server = fake_server(tmp_path, "sleep 600 & wait")  # SIGTERM ends the shell, not its child
    [worker] = server.processes()
    left = server.shut_down(timeout=1)
    assert left == [f"pid {worker.pid} 'sleep': sleep 600"]
    assert wait_until(lambda: gone(worker.pid, worker.create_time()))  # killed: gone once its parent reaps it


def test_shut_down_reports_nothing_when_the_server_stops_its_workers(tmp_path: Path) -> None:
    server = fake_server(tmp_path, "sleep 600 & trap 'kill \"$!\"; exit' TERM; wait")
    [worker] = server.processes()
    assert server.shut_down(timeout=10) == []
    assert wait_until(lambda: gone(worker.pid, worker.create_time()))
