"""The local doctor and ``CREW_ENV_DIR``: each crew built with its env file, as its jobs get it, and each file read
as a job's start reads it (mode, owner, syntax), plus a key file others can read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.supervisor.doctor.test_doctor import Deployment, deployment_in, doctor, findings

# Crews that read their key when built, as one that hands it to its LLM does; none imports CrewAI.
KEYED_REGISTRY = """
import os


class Keyed:
    def __init__(self):
        if not os.environ.get("KEYED_API_KEY", "").startswith("sk-"):
            raise RuntimeError("KEYED_API_KEY is not set")

    def kickoff(self, inputs=None):
        return None


registry = {crew_id: Keyed for crew_id in ("keyed", "open", "malformed", "foreign")}
"""
SECRET = "sk-never-printed"


@pytest.fixture
def deployment(tmp_path: Path) -> Deployment:
    found = deployment_in(tmp_path)
    (tmp_path / "keyed_crews.py").write_text(KEYED_REGISTRY)
    env_dir = tmp_path / "crew-env"
    env_dir.mkdir(mode=0o700)
    found.env.update(AIP_CREWAI_REGISTRY="keyed_crews:registry", AIP_CREWAI_CREW_ENV_DIR=str(env_dir))
    return found


def env_file(deployment: Deployment, crew_id: str, text: str, mode: int = 0o600) -> Path:
    path = Path(deployment.env["AIP_CREWAI_CREW_ENV_DIR"]) / f"{crew_id}.env"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_each_crew_is_built_with_its_env_file(deployment: Deployment) -> None:
    for crew_id in ("keyed", "open", "malformed", "foreign"):
        env_file(deployment, crew_id, f"# its provider\nKEYED_API_KEY={SECRET}-{crew_id}\n")
    answer = doctor(deployment, "--json")
    assert answer.code == 0, answer.out + answer.err
    found = {f["check"]: f for f in findings(answer)}
    assert found["registry"]["detail"] == "keyed_crews:registry: 4 of 4 crews build (foreign, keyed, malformed, open)"
    assert found["crew env"]["status"] == "ok" and "the files of 4 crews" in found["crew env"]["detail"]
    assert SECRET not in answer.out + answer.err


def test_each_file_a_job_would_refuse_and_a_key_others_can_read_is_a_problem(deployment: Deployment) -> None:
    env_file(deployment, "keyed", f"KEYED_API_KEY={SECRET}\n")
    opened = env_file(deployment, "open", f"KEYED_API_KEY={SECRET}\n", mode=0o644)
    malformed = env_file(deployment, "malformed", f"# its provider\nKEYED_API_KEY={SECRET}\n{SECRET}\n")
    foreign = env_file(deployment, "foreign", f"KEYED_API_KEY={SECRET}\n")
    os.chown(foreign, 65534, 65534)
    answer = doctor(deployment, "--json")
    assert answer.code == 1, answer.out + answer.err
    problems = [f for f in findings(answer) if f["status"] == "problem"]
    assert [f["check"] for f in problems] == ["crew env"] * 3, problems  # the crews themselves build
    details = sorted(f["detail"] for f in problems)
    assert details == sorted(
        [
            f"{opened}: mode 0644: group or others can read it, and the key it holds",
            f"{malformed}, line 3: not NAME=VALUE (a name of letters, digits and _)",
            f"{foreign}: mode 0600, uid 65534: others could change it; make it ours or root's, 0600",
        ]
    )
    assert next(f["fix"] for f in problems if str(opened) in f["detail"]) == f"chmod 600 {opened}"
    registry = next(f for f in findings(answer) if f["check"] == "registry")
    assert registry["detail"] == "keyed_crews:registry: 2 of 4 crews build (keyed, open)"
    assert SECRET not in answer.out + answer.err
