"""The sidecar gives what plain CrewAI gives: for every crew shape of ``tests/crews/shapes.py`` (tools, context,
a manager, structured outputs, async tasks, knowledge, the AIP qualification crew, and crews on CrewAI's own
``LLM`` class over HTTP to the loopback provider), the output of ``run``,
``batch_run`` and ``replay`` through a real supervisor equals, field for field (``comparable``), what
``crew.kickoff()`` / a fresh crew per input / ``crew.replay()`` give in a fresh interpreter
(``tests/helpers/kickoff.py``). This process never imports CrewAI.

One supervisor serves the module; the references are computed in one subprocess while it starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.conftest import TEST_REGISTRY, WARM_PROVIDERS, Server, start_server, stop_server, worker_env
from tests.helpers.kickoff import comparable
from worker.provider import URL_ENV, Provider

REFERENCE_TIMEOUT = 180.0
QUALIFICATION_KEY = "aip-crewai-exact-upstream-v1"  # what the AIP client's own end-to-end check sends


@dataclass(frozen=True)
class Case:
    run: dict[str, Any]  # the inputs of run (and of the replay after it)
    batch: list[dict[str, Any]]  # two different inputs for batch_run


def _topics(run: str) -> Case:
    return Case({"topic": run}, [{"topic": "alpha"}, {"topic": "beta"}])


CASES: dict[str, Case] = {
    "shape-tools": _topics("tool use"),
    "shape-context": _topics("handovers"),
    "shape-hierarchical": _topics("delegation"),
    "shape-structured": _topics("verdicts"),
    "shape-async": _topics("parallel scouting"),
    "shape-knowledge": Case(
        {"question": "What does cancelling a job kill?"},
        [{"question": "Where does every job run?"}, {"question": "Where is the journal kept?"}],
    ),
    "aip-qualification": Case({"case_id": "AIP-QUALIFICATION"}, [{"case_id": "AIP-1"}, {"case_id": "AIP-2"}]),
    "shape-llm-tools": _topics("native tool calls"),
    "shape-llm-structured": _topics("provider verdicts"),
}
SHAPES = list(CASES)


def _jobs() -> dict[tuple[str, str], tuple[str, dict[str, Any]]]:
    """(shape, name) -> (operation, input): a replay kicks off with ``run`` and replays the second task, as
    the tests do; ``run-again`` is the run once more, in another forked child with another store."""
    jobs: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
    for shape, case in CASES.items():
        jobs[shape, "run"] = ("run", case.run)
        jobs[shape, "batch_run"] = ("batch_run", {"inputs": case.batch})
        jobs[shape, "replay"] = ("replay", case.run)
        jobs[shape, "run-again"] = ("run", case.run)
    return jobs


@dataclass
class Fidelity:
    server: Server
    reference: dict[tuple[str, str], dict[str, Any]]

    def post(self, shape: str, operation: str, payload: dict[str, Any], action_id: str) -> dict[str, Any]:
        """A blocking start; the 200 body is the job's output, as the AIP client reads it."""
        body = {"crew_id": shape, "action_id": action_id, "operation": operation, "input": payload}
        headers = {"Idempotency-Key": f"key-{action_id}", "X-AIP-Action-ID": action_id}
        with self.server.client() as client:
            response = client.post("/jobs", json=body, headers=headers)
        assert response.status_code == 200, response.text
        output: dict[str, Any] = response.json()
        return output


@pytest.fixture(scope="module")
def fidelity(tmp_path_factory: pytest.TempPathFactory, provider: Provider) -> Iterator[Fidelity]:
    """The sidecar and the in-process references, the crews on CrewAI's own LLM served by one provider."""
    root = tmp_path_factory.mktemp("fidelity")
    jobs = _jobs()
    provided = {URL_ENV: provider.url}
    reference = start_reference(
        [[TEST_REGISTRY, s, op, payload] for (s, _), (op, payload) in jobs.items()], root, provided
    )
    try:
        settings = {
            "AIP_CREWAI_REGISTRY": TEST_REGISTRY,
            "AIP_CREWAI_ALLOWED_OPERATIONS": "run,batch_run,replay",
            **provided,
            **WARM_PROVIDERS,
        }
        server = start_server(root / "state", env=settings)  # starts while the references are computed
        outputs = finish_reference(reference, root)
    finally:
        reference.kill()
        reference.wait()
    yield Fidelity(server, dict(zip(jobs, outputs, strict=True)))
    stop_server(server)


def start_reference(jobs: list[list[Any]], root: Path, extra: dict[str, str]) -> subprocess.Popen[bytes]:
    """``tests.helpers.kickoff --each`` on ``jobs`` (``extra`` in its environment), answering into
    ``root/reference.jsonl``."""
    (root / "tmp").mkdir()
    env = {**worker_env(root), "TMPDIR": str(root / "tmp"), **extra}
    env.pop("CREWAI_STORAGE_DIR")  # a fresh CrewAI store per reference job
    (root / "jobs.json").write_bytes(orjson.dumps(jobs))
    with (
        open(root / "jobs.json", "rb") as stdin,
        open(root / "reference.jsonl", "wb") as stdout,
        open(root / "reference.err", "wb") as stderr,
    ):
        return subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.kickoff", "--each"],
            env=env,
            cwd=root,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
        )


def finish_reference(reference: subprocess.Popen[bytes], root: Path) -> list[dict[str, Any]]:
    """The reference's outputs, once it has exited (within REFERENCE_TIMEOUT) and every job succeeded."""
    reference.wait(REFERENCE_TIMEOUT)
    lines = (root / "reference.jsonl").read_bytes().splitlines()
    jobs = orjson.loads((root / "jobs.json").read_bytes())
    assert reference.returncode == 0 and len(lines) == len(jobs), (root / "reference.err").read_text()[-3000:]
    outputs = [orjson.loads(line) for line in lines]
    failed = [(job[1], job[2], out["error"]) for job, out in zip(jobs, outputs, strict=True) if "error" in out]
    assert not failed, f"in-process reference failed: {failed}"
    return outputs


def assert_same(sidecar: dict[str, Any], in_process: dict[str, Any]) -> None:
    """Equal comparable outputs; raw and token_usage first, so the usual failures read plainly."""
    actual, expected = comparable(sidecar), comparable(in_process)
    pairs = zip(actual.get("results", [actual]), expected.get("results", [expected]), strict=False)
    for index, (mine, theirs) in enumerate(pairs):
        assert mine["raw"] == theirs["raw"], f"raw of result {index}"
        tokens = (mine["token_usage"].get("total_tokens"), theirs["token_usage"].get("total_tokens"))
        assert mine["token_usage"] == theirs["token_usage"], f"token_usage of result {index}, total_tokens {tokens}"
    assert actual == expected


def test_every_shape_is_served(fidelity: Fidelity) -> None:
    with fidelity.server.client() as client:
        crews = client.get("/health").json()["crews"]
    assert set(SHAPES) <= set(crews)
    assert {"demo", "demo-knowledge", "recorder"} <= set(crews)  # and the rest of the one registry


@pytest.mark.parametrize("shape", SHAPES)
def test_run_gives_what_kickoff_gives(fidelity: Fidelity, shape: str) -> None:
    output = fidelity.post(shape, "run", CASES[shape].run, f"fid-run-{shape}")
    assert output["replay_task_ids"]
    assert_same(output, fidelity.reference[shape, "run"])


STRUCTURED = {"shape-structured", "shape-llm-structured"}


@pytest.mark.parametrize("shape", SHAPES)
def test_the_reference_holds_what_each_shape_makes(fidelity: Fidelity, shape: str) -> None:
    """Equal outputs prove nothing if both are empty: CrewAI's own output has each shape's parts."""
    output = fidelity.reference[shape, "run"]
    assert output["tasks_output"] and all(task["raw"] for task in output["tasks_output"])
    assert output["token_usage"]["total_tokens"] > 0
    if shape in STRUCTURED:
        assert output["pydantic"] and output["json_dict"] is None  # the last task's output_pydantic
        assert output["tasks_output"][0]["json_dict"] and output["tasks_output"][1]["pydantic"]
    if shape == "shape-tools":  # both tools really ran: their observations are in the answer
        assert "words, checksum" in output["raw"] and "initials " in output["raw"]


@pytest.mark.parametrize("shape", SHAPES)
def test_batch_run_gives_a_fresh_kickoff_per_input(fidelity: Fidelity, shape: str) -> None:
    output = fidelity.post(shape, "batch_run", {"inputs": CASES[shape].batch}, f"fid-batch-{shape}")
    assert output["count"] == len(CASES[shape].batch)
    assert_same(output, fidelity.reference[shape, "batch_run"])


@pytest.mark.parametrize("shape", SHAPES)
def test_replay_gives_what_crew_replay_gives(fidelity: Fidelity, shape: str) -> None:
    # Its own run first: a batch of the same crew replaces the stored kickoff that replay reads.
    run = fidelity.post(shape, "run", CASES[shape].run, f"fid-replay-run-{shape}")
    task_ids = run["replay_task_ids"]
    payload = {"task_id": task_ids[min(1, len(task_ids) - 1)], "inputs": CASES[shape].run}
    output = fidelity.post(shape, "replay", payload, f"fid-replay-{shape}")
    assert_same(output, fidelity.reference[shape, "replay"])


def test_qualification_crew_on_the_blocking_path(fidelity: Fidelity) -> None:
    """The AIP client's own end-to-end check, exactly: its input, its key, its two assertions."""
    action_id = "act_" + os.urandom(16).hex()
    body = {
        "crew_id": "aip-qualification",
        "action_id": action_id,
        "operation": "run",
        "input": {"case_id": "AIP-QUALIFICATION"},
    }
    headers = {"Idempotency-Key": QUALIFICATION_KEY, "X-AIP-Action-ID": action_id}
    with fidelity.server.client() as client:
        response = client.post("/jobs", json=body, headers=headers)
    assert response.status_code == 200, response.text
    output = response.json()
    assert output["raw"] == "case triaged"
    assert output["token_usage"]["total_tokens"] == 5
    assert_same(output, fidelity.reference["aip-qualification", "run"])


@pytest.mark.parametrize("shape", SHAPES)
def test_reference_outputs_are_deterministic(fidelity: Fidelity, shape: str) -> None:
    """Two fresh kickoffs give equal outputs (other pids, times, stores), so a failure above is the sidecar's,
    not a crew's nondeterminism. (The reference and the sidecar's workers are different interpreters, with
    different hash seeds: a passing comparison above shows that too.)"""
    assert_same(fidelity.reference[shape, "run-again"], fidelity.reference[shape, "run"])
