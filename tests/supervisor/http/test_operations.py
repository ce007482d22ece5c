"""All seven operations through HTTP: policy, exact input validation, and each one run and stopped."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Server, gone, start_body, start_server, stop_server, wait_until
from tests.crews.base import EVIDENCE_DIR, HEARTBEAT

pytestmark = pytest.mark.usefixtures("launcher")

KEY = {"Idempotency-Key": "key-1"}
ALL = "run,batch_run,replay,train,test,knowledge_query,memory_reset"


@pytest.fixture(scope="module")
def ops_server(tmp_path_factory: pytest.TempPathFactory, launcher: str) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("ops")
    training = root / "training"
    training.mkdir(mode=0o700)
    evidence = root / "evidence"
    evidence.mkdir()
    env = {"AIP_CREWAI_ALLOWED_OPERATIONS": ALL, "AIP_CREWAI_TRAINING_DIR": str(training), EVIDENCE_DIR: str(evidence)}
    running = start_server(root / "state", env=env)
    running.training = training  # type: ignore[attr-defined]
    running.evidence = evidence  # type: ignore[attr-defined]
    yield running
    stop_server(running)


def op(operation: str, action: str, payload: Any, crew: str = "demo") -> dict[str, Any]:
    return start_body(crew, action, operation=operation, input=payload)


INVALID: list[tuple[str, Any, str]] = [
    ("batch_run", {}, "input.inputs"),
    ("batch_run", {"inputs": []}, "input.inputs"),
    ("batch_run", {"inputs": [{}] * 101}, "input.inputs"),
    ("batch_run", {"inputs": [1]}, "input.inputs.0"),
    ("batch_run", {"inputs": [{f"p{i}": i for i in range(513)}]}, "input.inputs.0"),
    ("batch_run", {"inputs": [{}], "extra": 1}, "input.extra"),
    ("replay", {}, "input.task_id"),
    ("replay", {"task_id": ""}, "input.task_id"),
    ("replay", {"task_id": "x" * 257}, "input.task_id"),
    ("replay", {"task_id": "a\nb"}, "input.task_id"),
    ("replay", {"task_id": 5}, "input.task_id"),
    ("replay", {"task_id": "t", "inputs": []}, "input.inputs"),
    ("train", {"n_iterations": 1}, "input.artifact_name"),
    ("train", {"n_iterations": 0, "artifact_name": "a"}, "input.n_iterations"),
    ("train", {"n_iterations": 101, "artifact_name": "a"}, "input.n_iterations"),
    ("train", {"n_iterations": True, "artifact_name": "a"}, "input.n_iterations"),
    ("train", {"n_iterations": 1.0, "artifact_name": "a"}, "input.n_iterations"),
    ("train", {"n_iterations": 1, "artifact_name": "../escape"}, "input.artifact_name"),
    ("train", {"n_iterations": 1, "artifact_name": "a" * 129}, "input.artifact_name"),
    ("train", {"n_iterations": 1, "artifact_name": "a", "feedback": "f" * 4097}, "input.feedback"),
    ("test", {"n_iterations": 1}, "input.eval_llm"),
    ("test", {"n_iterations": 1, "eval_llm": "e" * 257}, "input.eval_llm"),
    ("test", {"n_iterations": False, "eval_llm": "e"}, "input.n_iterations"),
    ("knowledge_query", {"query": []}, "input.query"),
    ("knowledge_query", {"query": ["q"] * 101}, "input.query"),
    ("knowledge_query", {"query": ["q" * 4097]}, "input.query.0"),
    ("knowledge_query", {"query": ["a\x00b"]}, "input.query.0"),
    ("knowledge_query", {"query": "q"}, "input.query"),
    ("knowledge_query", {"query": ["q"], "results_limit": 0}, "input.results_limit"),
    ("knowledge_query", {"query": ["q"], "results_limit": 101}, "input.results_limit"),
    ("knowledge_query", {"query": ["q"], "results_limit": True}, "input.results_limit"),
    ("knowledge_query", {"query": ["q"], "score_threshold": 1.5}, "input.score_threshold"),
    ("knowledge_query", {"query": ["q"], "score_threshold": True}, "input.score_threshold"),
    ("memory_reset", {"command_type": "everything"}, "input.command_type"),
    ("memory_reset", {}, "input.command_type"),
]


@pytest.mark.parametrize(("operation", "payload", "field"), INVALID)
def test_operation_inputs_are_validated_exactly(ops_server: Server, operation: str, payload: Any, field: str) -> None:
    action = f"invalid-{operation}-{abs(hash(repr(payload)))}"
    with ops_server.client() as client:
        response = client.post("/jobs", json=op(operation, action, payload), headers=KEY)
        assert response.status_code == 422, response.text
        assert response.json()["detail"].startswith(field + ":"), response.json()
        assert client.get(f"/jobs/{action}").status_code == 404  # nothing stored, nothing launched


def test_health_lists_every_enabled_operation(ops_server: Server) -> None:
    with ops_server.client() as client:
        health = client.get("/health").json()
    assert health["operations"] == sorted([*ALL.split(","), "status", "events", "cancel"])
    assert health["training_directory"] is True


def test_disabled_operation_is_forbidden_but_exact_repeats_still_answer(tmp_path: Path) -> None:
    reset = op("memory_reset", "reset-1", {"command_type": "memory"})
    first = start_server(tmp_path / "state", env={"AIP_CREWAI_ALLOWED_OPERATIONS": "run,memory_reset"})
    try:
        with first.client() as client:
            admitted = client.post("/jobs", json=reset, headers=KEY)
            assert admitted.status_code in (200, 502)
    finally:
        first.stop()
    second = start_server(tmp_path / "state", env={"AIP_CREWAI_ALLOWED_OPERATIONS": "run"})
    try:
        with second.client() as client:
            # Policy changed after admission: the exact repeat still finds its job.
            again = client.post("/jobs", json=reset, headers=KEY)
            assert again.status_code == admitted.status_code and again.json() == admitted.json()
            for operation, payload in [("memory_reset", {"command_type": "all"}), ("replay", {"task_id": "t"})]:
                response = client.post("/jobs", json=op(operation, f"off-{operation}", payload), headers=KEY)
                assert response.status_code == 403 and operation in response.json()["detail"]
                assert client.get(f"/jobs/off-{operation}").status_code == 404
    finally:
        second.stop()


def test_batch_run_replay_and_their_outputs(ops_server: Server) -> None:
    with ops_server.client() as client:
        batch = client.post(
            "/jobs", json=op("batch_run", "batch-1", {"inputs": [{"topic": "a"}, {"topic": "b"}]}), headers=KEY
        )
        assert batch.status_code == 200, batch.text
        assert batch.json()["count"] == 2 and all(r["raw"] for r in batch.json()["results"])

        run = client.post("/jobs", json=start_body("recorder", "rec-run"), headers=KEY)
        assert run.status_code == 200, run.text
        task_ids = run.json()["replay_task_ids"]
        assert len(task_ids) == 2
        replay = client.post(
            "/jobs", json=op("replay", "rec-replay", {"task_id": task_ids[1]}, "recorder"), headers=KEY
        )
        assert replay.status_code == 200, replay.text
        assert replay.json()["tasks_output"][0]["raw"] == run.json()["tasks_output"][0]["raw"]
        unknown = client.post("/jobs", json=op("replay", "rec-replay-2", {"task_id": "nope"}, "recorder"), headers=KEY)
        assert unknown.status_code == 502
        terminal = unknown.json()["terminal"]
        assert terminal["error_type"] == "ReplayError" and "nope" in terminal["message"]
        assert terminal["uncertain_outcome"] is False


def test_train_test_knowledge_and_memory_reset(ops_server: Server) -> None:
    training: Path = ops_server.training  # type: ignore[attr-defined]
    with ops_server.client() as client:
        train = {"n_iterations": 1, "artifact_name": "agent.pkl", "feedback": "be brief"}
        trained = client.post("/jobs", json=op("train", "train-1", train), headers=KEY)
        assert trained.status_code == 200, trained.text
        assert trained.json() == {"status": "completed", "artifact_name": "agent.pkl", "n_iterations": 1}
        with open(training / "agent.pkl", "rb") as artifact:
            assert pickle.load(artifact)
        no_feedback = client.post("/jobs", json=op("train", "train-2", {**train, "feedback": None}), headers=KEY)
        assert no_feedback.status_code == 502
        assert "feedback" in no_feedback.json()["terminal"]["message"]

        tested = client.post(
            "/jobs", json=op("test", "test-1", {"n_iterations": 1, "eval_llm": "offline-eval"}), headers=KEY
        )
        assert tested.status_code == 200, tested.text
        assert tested.json()["eval_llm"] == "offline-eval" and tested.json()["scores"]

        query = {"query": ["What does cancelling a job kill?"], "results_limit": 1}
        found = client.post("/jobs", json=op("knowledge_query", "know-1", query, "demo-knowledge"), headers=KEY)
        assert found.status_code == 200, found.text
        assert "process group" in str(found.json()["results"])

        reset = client.post("/jobs", json=op("memory_reset", "reset-1", {"command_type": "memory"}), headers=KEY)
        assert reset.status_code == 502 and "not initialized" in reset.json()["terminal"]["message"]


def beaters(heartbeat: Path) -> set[str]:
    """The pids that wrote ``heartbeat`` (RecordingLLM blocked in a model call, one line per beat)."""
    return set(heartbeat.read_text().split()) if heartbeat.exists() else set()


def test_thread_backed_operations_are_stopped_for_real(ops_server: Server) -> None:
    block = {"mode": "block"}
    heartbeat = ops_server.evidence / HEARTBEAT  # type: ignore[attr-defined]
    with ops_server.client() as client:
        # A cancel during training: the worker is killed, and no artifact appears.
        heartbeat.unlink(missing_ok=True)
        train = {"n_iterations": 1, "artifact_name": "never.pkl", "feedback": "x", "inputs": block}
        with client.stream(
            "POST", "/jobs/stream", json=op("train", "train-stop", train, "recorder"), headers=KEY
        ) as response:
            for line in response.iter_lines():
                if line == "event: started":
                    break
            # SIGTERM is ignored since the factory ran (before `started`); the first beat says it is blocked.
            assert wait_until(lambda: beaters(heartbeat), timeout=60), "the training never reached its model call"
            record = client.post("/jobs/train-stop/cancel", json={"crew_id": "recorder", "action_id": "train-stop"})
        proof = record.json()["terminal"]
        assert record.json()["status"] == "cancelled" and proof["stop_confirmed"] is True and gone(proof["pid"])
        assert beaters(heartbeat) == {str(proof["pid"])}  # the worker it killed is the one that was blocked
        assert not (ops_server.training / "never.pkl").exists()  # type: ignore[attr-defined]

        # A timeout during test: the same kill, recorded as an uncertain failure; the heartbeat stops.
        heartbeat.unlink(missing_ok=True)
        slow = op("test", "test-timeout", {"n_iterations": 1, "eval_llm": "offline-eval", "inputs": block}, "recorder")
        timed_out = client.post("/jobs", json={**slow, "timeout_ms": 9000}, headers=KEY)
        assert timed_out.status_code == 502 and timed_out.json()["status"] == "failed", timed_out.text
        terminal = timed_out.json()["terminal"]
        assert terminal["error_type"] == "TimeoutError" and terminal["reason"] == "timeout"
        assert terminal["uncertain_outcome"] is True and terminal["stop_confirmed"] is True and gone(terminal["pid"])
        # It was beating while blocked, and nothing of the job runs on: every beat came from the worker, which
        # is gone (no process holds its pid, not even a zombie), so no process is left that could beat again.
        assert beaters(heartbeat) == {str(terminal["pid"])}
