"""Every tool works in the shell the README sets up, which exports AIP_CREWAI_BEARER_TOKEN_FILE: the tools that
start supervisors of their own (the pytest plugin, ``chaos``) give them their own token whatever the shell exports,
and ``doctor``, ``serve`` and the operator commands read the exported file (one holding two tokens, as during a
rotation). tests/system/docs/test_front_door.py runs the README's own blocks; this runs what they do not."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from supervisor.testing import free_port
from tests.conftest import ROOT
from tests.helpers.waiting import wait_until

SECONDS = 600  # doctor and chaos each import CrewAI and build crews: minutes on a loaded machine


@pytest.fixture
def readme_shell(tmp_path: Path) -> dict[str, str]:
    """The README's exports (its "mkdir, cp, token, export" block), in a directory of its own."""
    (tmp_path / "state").mkdir(mode=0o700)
    shutil.copy(ROOT / "docs" / "examples" / "my_crews.py", tmp_path)
    token = tmp_path / "token"
    token.write_text(f"{secrets.token_urlsafe(32)}\n{secrets.token_urlsafe(32)}\n")  # mid-rotation: two
    token.chmod(0o600)
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
        "AIP_CREWAI_REGISTRY": "my_crews:registry",
        "MY_CREWS_OFFLINE": "1",
        "AIP_CREWAI_STATE_FILE": str(tmp_path / "state" / "journal.db"),
        "AIP_CREWAI_BEARER_TOKEN_FILE": str(token),
        "AIP_CREWAI_WARMUP": "offline",
    }


def tool(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "supervisor", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=SECONDS)


@pytest.mark.timeout(SECONDS)
def test_the_pytest_plugin_serves_with_its_own_token(readme_shell: dict[str, str], tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\ncrew_registry = my_crews:registry\n")
    (project / "test_served.py").write_text(
        "def test_served(crew_client):\n    assert crew_client.get('/health').json()['status'] == 'ready'\n"
    )
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "supervisor.pytest_plugin", "-q"]
    done = subprocess.run(command, cwd=project, env=readme_shell, capture_output=True, text=True, timeout=SECONDS)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "1 passed" in done.stdout


@pytest.mark.timeout(SECONDS)
def test_chaos_starts_its_own_supervisor(readme_shell: dict[str, str], tmp_path: Path) -> None:
    done = tool(readme_shell, tmp_path, "chaos", "--iterations", "1", "--faults", "worker", "--seed", "1")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "set only one of" not in done.stdout + done.stderr


@pytest.mark.timeout(SECONDS)
def test_doctor_serve_and_the_operator_commands_read_the_exported_file(
    readme_shell: dict[str, str], tmp_path: Path
) -> None:
    doctor = tool(readme_shell, tmp_path, "doctor")
    assert doctor.returncode == 0, doctor.stdout[-3000:] + doctor.stderr[-3000:]
    assert "2 contract tokens" in doctor.stdout
    port = free_port()
    env = {**readme_shell, "AIP_CREWAI_PORT": str(port), "AIP_CREWAI_URL": f"http://127.0.0.1:{port}"}
    with open(tmp_path / "serve.log", "wb") as log:
        command = [sys.executable, "-m", "supervisor", "serve"]
        serve = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=log, stderr=log)
    try:
        second = Path(env["AIP_CREWAI_BEARER_TOKEN_FILE"]).read_text().split()[1]

        def ready() -> bool:
            try:
                answer = httpx.get(f"{env['AIP_CREWAI_URL']}/health", headers={"Authorization": f"Bearer {second}"})
            except httpx.TransportError:
                return False
            return answer.status_code == 200 and answer.json()["status"] == "ready"

        assert wait_until(ready, SECONDS / 2, interval=0.5), (tmp_path / "serve.log").read_text()[-3000:]
        run = tool(env, tmp_path, "run", "research", "--input", '{"topic": "tides"}', "--action-id", "first")
        assert run.returncode == 0, run.stdout + run.stderr  # with the file's first token
        for command in (["jobs"], ["show", "first"]):
            done = tool(env, tmp_path, *command)
            assert done.returncode == 0 and "first" in done.stdout, done.stdout + done.stderr
        output = tool(env, tmp_path, "output", "first")
        assert output.returncode == 0 and "stdout: 0 bytes written" in output.stdout, output.stdout + output.stderr
    finally:
        serve.terminate()
        serve.wait(60)
