"""The six operations beside ``run``, each in a real worker process running real CrewAI offline.

The workers are forked from one fork server for the module, as the supervisor's default launcher forks them:
a worker spawned cold costs a CrewAI import (~4 s of CPU), a forked one a few ms. The fork server lives on a
loop of its own; each test hands it its coroutines.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from protocol import TRAINING_DIR, Chunk, Completed, Failed, FrameError, Start, Started, partial_name
from supervisor.processes.containment import Containment
from supervisor.processes.forkserver import ForkServerLauncher
from supervisor.processes.launcher import SpawnLauncher
from supervisor.processes.process import StopEvidence, WorkerProcess
from supervisor.processes.reaper import Reaper
from tests.conftest import gone, worker_env
from tests.crews.base import CALL_LOG, HEARTBEAT
from tests.helpers.ledger import answering, next_answered

T = TypeVar("T")


class Forks:
    """A fork server on a loop in a thread of its own, for the module: ``run`` runs a coroutine there."""

    def __init__(self, home: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="forks", daemon=True)
        self.thread.start()
        try:
            self.launcher = self.run(self._open(home))
        except BaseException:
            self._end_loop()
            raise

    @staticmethod
    async def _open(home: Path) -> ForkServerLauncher:
        launcher = ForkServerLauncher(SpawnLauncher(Reaper()))
        await launcher.describe(worker_env(home), str(home))
        if not launcher.alive:  # a cold fallback would spawn every worker, and prove nothing new
            await launcher.stop()
            raise AssertionError(f"no fork server: {launcher.refused}")
        return launcher

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Its result; interrupted (a timeout, a failure), the coroutine is cancelled too, so that its own
        cleanup (killing its worker) runs as under ``asyncio.run``."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def close(self) -> None:
        """Whatever a test left running is cancelled and done with, then the fork server is stopped."""

        async def settle() -> None:
            left = asyncio.all_tasks() - {asyncio.current_task()}
            for task in left:
                task.cancel()
            await asyncio.gather(*left, return_exceptions=True)
            await self.launcher.stop()

        try:
            self.run(settle())
        finally:
            self._end_loop()

    def _end_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


@pytest.fixture(scope="module")
def forks(subreaper: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Forks]:
    """The module's fork server, in the test process made a subreaper: its workers are ours to reap."""
    forks = Forks(tmp_path_factory.mktemp("forkserver"))
    yield forks
    forks.close()


def env(tmp: Path) -> dict[str, str]:
    training = tmp / "training"
    training.mkdir(mode=0o700, exist_ok=True)
    return {**worker_env(tmp), TRAINING_DIR: str(training)}


async def launch(forks: Forks, tmp: Path, crew: str, operation: str, inputs: dict[str, Any]) -> WorkerProcess:
    # cwd = tmp: CrewAI's training files and the recorder's evidence land there, as in a job's scratch dir.
    worker = await forks.launcher.spawn(env(tmp), str(tmp))
    if worker.launched_by != "forkserver":  # a cold fallback: what this module proves is the forked path
        await worker.kill()
        raise AssertionError("the module's fork server died: a worker was spawned cold")
    worker.send(Start("job-1", crew, operation, inputs, 600_000))
    return worker


async def finish(forks: Forks, tmp: Path, crew: str, operation: str, inputs: dict[str, Any]) -> list[Any]:
    """Every message of one job, after checking the worker left with status 0."""
    worker = await launch(forks, tmp, crew, operation, inputs)
    messages = []
    try:
        while (message := await next_answered(worker, 90)) is not None:
            assert not isinstance(message, FrameError), message
            messages.append(message)
        assert await worker.wait_exit(10) == 0, worker.stderr.text()[-2000:]
    except BaseException:
        await worker.kill()  # a failed test must not leave a worker running
        raise
    assert isinstance(messages[-1], Completed | Failed), messages[-1]
    return messages


def job(forks: Forks, tmp: Path, crew: str, operation: str, inputs: dict[str, Any]) -> Any:
    """The terminal message of one job."""
    return forks.run(finish(forks, tmp, crew, operation, inputs))[-1]


def completed(message: Any) -> dict[str, Any]:
    assert isinstance(message, Completed), message
    return message.output


def calls(tmp: Path) -> list[str]:
    log = tmp / CALL_LOG
    return log.read_text().split() if log.exists() else []


def stop_blocked(forks: Forks, tmp: Path, crew: str, operation: str, inputs: dict[str, Any]) -> None:
    """Start a job whose model blocks (ignoring SIGTERM) while beating a file; kill it; prove nothing runs on."""
    beat = tmp / HEARTBEAT

    def size() -> int:
        return beat.stat().st_size if beat.exists() else 0

    async def scenario() -> tuple[StopEvidence, WorkerProcess, list[Any]]:
        worker = await launch(forks, tmp, crew, operation, inputs)
        try:
            while not isinstance(message := await asyncio.wait_for(worker.next_message(), 60), Started):
                assert message is not None and not isinstance(message, FrameError | Failed), message
            answering(worker)  # its LLM calls wait for their ledger entries' answers
            assert await eventually(lambda: size() > 0, 60), "the model never started blocking"
            before = size()
            assert await eventually(lambda: size() > before, 5), "no heartbeat: nothing to prove"
        except BaseException:
            await worker.kill()
            raise
        tree = Containment(worker.pid, worker.create_time).descendants()
        return await worker.kill(grace=0.2), worker, tree

    evidence, worker, tree = forks.run(scenario())
    stopped_at = size()
    time.sleep(0.5)  # 25 heartbeats' worth
    assert size() == stopped_at, "the blocked call still runs after kill() returned"
    assert evidence.stop_confirmed and evidence.signal == "SIGKILL" and evidence.exit_status == -signal.SIGKILL
    assert gone(worker.pid) and all(gone(p.pid) for p in tree)


async def eventually(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def test_batch_run_kicks_off_once_per_input_without_streaming(forks: Forks, tmp_path: Path) -> None:
    messages = forks.run(
        finish(forks, tmp_path, "demo", "batch_run", {"inputs": [{"topic": "alpha"}, {"topic": "beta"}]})
    )
    assert not any(isinstance(m, Chunk) for m in messages)
    output = completed(messages[-1])
    assert output["count"] == len(output["results"]) == 2
    for result, topic in zip(output["results"], ("alpha", "beta"), strict=True):
        assert set(result) >= {"raw", "json_dict", "pydantic", "tasks_output", "token_usage"}
        assert result["raw"].startswith("Writer reports finding")
        assert result["tasks_output"][0]["description"] == f"Research {topic}."


@pytest.mark.timeout(400)
def test_replay_in_a_later_process_reuses_the_stored_outputs(forks: Forks, tmp_path: Path) -> None:
    run = completed(job(forks, tmp_path, "recorder", "run", {"mode": "answer"}))
    first, second = run["replay_task_ids"]
    assert [t["description"] for t in run["tasks_output"]] == [
        "Gather notes in answer mode.",
        "Write the report in answer mode.",
    ]
    assert calls(tmp_path) == ["Gather", "Write"]

    # A fresh process, a fresh crew: the first task's output comes from storage, its model is not called.
    replayed = completed(job(forks, tmp_path, "recorder", "replay", {"task_id": second}))
    assert calls(tmp_path) == ["Gather", "Write", "Write"]
    # The output holds both tasks: the first as stored by the earlier process, the second new.
    assert replayed["tasks_output"][0]["raw"] == run["tasks_output"][0]["raw"]
    assert replayed["tasks_output"][1]["description"] == "Write the report in answer mode."
    assert replayed["raw"].startswith("Recorder reports finding")
    # The replayed task got this crew's new id; the reused one kept its stored id.
    assert replayed["replay_task_ids"][0] == first and replayed["replay_task_ids"][1] != second

    unknown = job(forks, tmp_path, "recorder", "replay", {"task_id": "no-such-task"})
    assert isinstance(unknown, Failed) and unknown.error_type == "ReplayError" and not unknown.uncertain_outcome
    assert "not in this crew's latest kickoff" in unknown.message
    other_crew = job(forks, tmp_path, "demo", "replay", {"task_id": first})
    assert isinstance(other_crew, Failed) and other_crew.error_type == "ReplayError"
    assert "does not match the stored task outputs" in other_crew.message
    assert calls(tmp_path) == ["Gather", "Write", "Write"]  # failures ran no model

    stop_blocked(forks, tmp_path, "recorder", "replay", {"task_id": first, "inputs": {"mode": "block"}})


def test_train_with_feedback_publishes_a_loadable_artifact(forks: Forks, tmp_path: Path) -> None:
    inputs = {"n_iterations": 2, "artifact_name": "recorder-v1.pkl", "inputs": {"mode": "answer"}}
    output = completed(job(forks, tmp_path, "recorder", "train", {**inputs, "feedback": "Cite your sources."}))
    assert output == {"status": "completed", "artifact_name": "recorder-v1.pkl", "n_iterations": 2}
    training = tmp_path / "training"
    assert os.listdir(training) == ["recorder-v1.pkl"]  # no temporary left beside it
    with open(training / "recorder-v1.pkl", "rb") as artifact:
        trained = pickle.load(artifact)
    assert set(trained["Recorder"]) == {"suggestions", "quality", "final_summary"}
    # The feedback reached CrewAI through the provider (stdin was never read): it is in the raw training data.
    with open(tmp_path / "training_data.pkl", "rb") as raw:
        iterations = next(iter(pickle.load(raw).values()))
    assert [iterations[i]["human_feedback"] for i in (0, 1)] == ["Cite your sources."] * 2


def test_train_without_feedback_fails_before_training(forks: Forks, tmp_path: Path) -> None:
    failed = job(forks, tmp_path, "recorder", "train", {"n_iterations": 1, "artifact_name": "never"})
    assert isinstance(failed, Failed) and failed.error_type == "TrainingError" and not failed.uncertain_outcome
    assert "feedback" in failed.message
    assert calls(tmp_path) == [] and os.listdir(tmp_path / "training") == []  # no model was ever called


def test_train_stopped_mid_call_leaves_no_artifact(forks: Forks, tmp_path: Path) -> None:
    inputs = {"n_iterations": 1, "artifact_name": "blocked", "feedback": "Good.", "inputs": {"mode": "block"}}
    stop_blocked(forks, tmp_path, "recorder", "train", inputs)
    # No artifact: only the job's own hidden file, opened before training, which a killed worker cannot
    # remove and the supervisor does (tests/supervisor/journal/test_leftovers.py); its name is known to both.
    assert os.listdir(tmp_path / "training") == [partial_name("blocked", "job-1")]


def test_test_scores_every_task_with_an_offline_evaluator(forks: Forks, tmp_path: Path) -> None:
    output = completed(job(forks, tmp_path, "demo", "test", {"n_iterations": 2, "eval_llm": "offline-eval"}))
    assert {k: output[k] for k in ("status", "n_iterations", "eval_llm")} == {
        "status": "completed",
        "n_iterations": 2,
        "eval_llm": "offline-eval",
    }
    assert len(output["scores"]) == 4  # two tasks, two iterations
    for score in output["scores"]:
        assert score["quality"] == 8.0 and score["model"] == "offline-eval" and score["execution_duration"] >= 0


def test_test_stopped_mid_call(forks: Forks, tmp_path: Path) -> None:
    stop_blocked(
        forks,
        tmp_path,
        "recorder",
        "test",
        {"n_iterations": 1, "eval_llm": "offline-eval", "inputs": {"mode": "block"}},
    )


def test_knowledge_query_finds_the_matching_fact_offline(forks: Forks, tmp_path: Path) -> None:
    query = {"query": ["What does cancelling a job kill?"], "results_limit": 2}
    results = completed(job(forks, tmp_path, "demo-knowledge", "knowledge_query", query))["results"]
    assert 1 <= len(results) <= 2
    assert results[0]["content"].startswith("Cancelling a job kills")
    assert all(r["score"] >= 0.35 for r in results)
    assert [r["score"] for r in results] == sorted((r["score"] for r in results), reverse=True)


@pytest.mark.parametrize(
    ("command_type", "expected"),
    [
        ("kickoff_outputs", {"status": "completed", "command_type": "kickoff_outputs"}),
        ("memory", "Failed to reset memory memory: Memory memory system is not initialized"),
    ],
)
def test_memory_reset(forks: Forks, tmp_path: Path, command_type: str, expected: dict[str, Any] | str) -> None:
    outcome = job(forks, tmp_path, "demo", "memory_reset", {"command_type": command_type})
    if isinstance(expected, dict):
        assert completed(outcome) == expected
    else:
        # CrewAI's own configuration message, not the generic one.
        assert isinstance(outcome, Failed) and outcome.error_type == "MemoryResetError"
        assert outcome.message == expected and not outcome.uncertain_outcome
