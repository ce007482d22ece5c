"""Real worker processes running real CrewAI offline, launched, read and stopped by the supervisor's code."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from protocol import (
    Building,
    Chunk,
    Completed,
    ExitCode,
    Failed,
    FrameError,
    FrameTooLarge,
    Hello,
    InvalidDocument,
    Start,
    Started,
    TruncatedFrame,
)
from supervisor.processes.launcher import SpawnLauncher
from supervisor.processes.process import WorkerProcess
from supervisor.processes.reaper import Reaper
from tests.conftest import ROOT, gone, reaped_orphan, wait_until, worker_env
from tests.crews.base import BLOCKED
from tests.helpers.ledger import answering, next_answered

pytestmark = pytest.mark.usefixtures("subreaper")  # tests/conftest.py: orphans come to us, so gone means reaped


def run(coro: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(coro())


async def start(tmp: Path, crew: str, inputs: dict[str, Any] | None = None) -> WorkerProcess:
    worker = await SpawnLauncher(Reaper()).spawn(worker_env(tmp), str(tmp))
    worker.send(Start("job-1", crew, "run", inputs or {}, 600_000))
    return worker


async def collect(worker: WorkerProcess) -> list[Any]:
    messages = []
    while (message := await next_answered(worker)) is not None:
        messages.append(message)
    return messages


async def until(worker: WorkerProcess, wanted: Callable[[Any], bool]) -> list[Any]:
    seen = []
    while True:
        message = await next_answered(worker)
        assert message is not None and not isinstance(message, FrameError), (message, worker.stderr.text())
        seen.append(message)
        if wanted(message):
            return seen


def test_demo_run_streams_and_completes_deterministically(tmp_path: Path) -> None:
    async def once() -> tuple[list[Any], int | None]:
        worker = await start(tmp_path, "demo")
        messages = await collect(worker)
        return messages, await worker.wait_exit(10)

    first, status = run(once)
    assert [type(message) for message in first[:3]] == [Hello, Building, Started]  # the factory ran between
    chunks = [m for m in first if isinstance(m, Chunk)]
    assert chunks and all(c.channel == "llm" and c.data["channel"] == "llm" for c in chunks)
    assert "content" in chunks[0].data
    done = first[-1]
    assert isinstance(done, Completed), first[-1]
    assert set(done.output) >= {"raw", "json_dict", "pydantic", "tasks_output", "token_usage"}
    assert done.output["raw"].startswith("Writer reports finding")
    assert done.output["token_usage"]["total_tokens"] > 0
    assert status == 0
    second, _ = run(once)
    assert second[-1].output["raw"] == done.output["raw"]


@pytest.mark.parametrize(("crew", "grace"), [("demo-slow", 0.0), ("stubborn", 0.3)])
def test_stop_kills_the_worker_and_proves_it(tmp_path: Path, crew: str, grace: float) -> None:
    async def scenario() -> tuple[Any, WorkerProcess]:
        worker = await start(tmp_path, crew, {"seconds": 600})
        await until(worker, lambda m: isinstance(m, Chunk if crew == "demo-slow" else Started))
        if crew == "stubborn":  # its factory ignored SIGTERM before `started`; now wait until it blocks
            blocked = tmp_path / BLOCKED  # the worker's cwd
            answering(worker)  # its LLM call waits for its ledger entry's answer

            def inside_the_call() -> bool:
                return blocked.exists() and str(worker.pid) in blocked.read_text().split()

            assert await asyncio.to_thread(wait_until, inside_the_call, 30), worker.stderr.text()
        return await worker.kill(grace), worker

    evidence, worker = run(scenario)
    assert evidence.stop_confirmed and evidence.signal == "SIGKILL" and evidence.exit_status == -signal.SIGKILL
    assert evidence.pid == worker.pid and evidence.elapsed_ms >= grace * 1000
    assert gone(worker.pid), "worker pid still present (alive or zombie)"


def test_worker_dies_with_its_parent(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, str(ROOT / "tests/helpers/orphaning_parent.py")],
        env=worker_env(tmp_path, "worker.demo:registry"),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
    )
    assert parent.stdout is not None
    worker_pid, keeper_pid = map(int, parent.stdout.readline().split())
    assert not gone(worker_pid)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    try:
        status = reaped_orphan(worker_pid, timeout=10)
        assert status is not None, "worker outlived its parent"
    finally:
        os.kill(keeper_pid, signal.SIGKILL)
        wait_until(lambda: gone(keeper_pid))
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL  # PDEATHSIG, not EOF
    assert gone(worker_pid)


def test_worker_exits_when_its_control_pipe_closes(tmp_path: Path) -> None:
    async def scenario() -> int | None:
        worker = await SpawnLauncher(Reaper()).spawn(worker_env(tmp_path), str(tmp_path))
        assert isinstance(await worker.next_message(), Hello)
        worker.close_control()
        return await worker.wait_exit(10)

    assert run(scenario) == ExitCode.CONTROL_CLOSED  # before CrewAI even finished importing


def test_crew_failure_is_reported_by_class_without_its_text(tmp_path: Path) -> None:
    async def scenario() -> list[Any]:
        return await collect(await start(tmp_path, "boom"))

    last = run(scenario)[-1]
    assert isinstance(last, Failed) and last.uncertain_outcome  # the crew had begun: effects are possible
    assert "secret" not in last.message and last.error_type == "RuntimeError" and last.reason == "operation_failed"


def test_an_output_over_4_mib_fails_cleanly(tmp_path: Path) -> None:
    async def scenario() -> list[Any]:
        return await collect(await start(tmp_path, "huge"))

    last = run(scenario)[-1]
    assert isinstance(last, Failed) and last.error_type == "RegistryError" and last.reason == "output_too_large"


@pytest.mark.parametrize(
    ("behaviour", "error"),
    [
        ("garbage", InvalidDocument),
        ("oversized", FrameTooLarge),
        ("truncated", TruncatedFrame),
        ("not-json", FrameError),
        ("unknown-type", FrameError),
        ("old-version", FrameError),
    ],
)
def test_hostile_frames_are_protocol_errors_not_crashes(tmp_path: Path, behaviour: str, error: type) -> None:
    async def scenario() -> tuple[Any, Any]:
        launcher = SpawnLauncher(Reaper(), [sys.executable, str(ROOT / "tests/helpers/hostile_worker.py"), behaviour])
        worker = await launcher.spawn(worker_env(tmp_path), str(tmp_path))
        first = await asyncio.wait_for(worker.next_message(), 30)
        after = await asyncio.wait_for(worker.next_message(), 30)
        evidence = await worker.kill()
        return first, (after, evidence)

    first, (after, evidence) = run(scenario)
    assert isinstance(first, error), first
    assert after is None  # the reader closed cleanly after the error
    assert evidence.stop_confirmed
