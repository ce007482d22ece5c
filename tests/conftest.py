"""Shared helpers: real workers and a real supervisor on loopback, with the test registry."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import psutil
import pytest

from protocol import QUIET_CREWAI
from supervisor.console import sse
from supervisor.processes.reaper import become_subreaper, stop_being_subreaper
from supervisor.testing import Server
from tests.helpers.scripted_provider import scripted_provider
from tests.helpers.waiting import wait_until
from worker.provider import Provider

if TYPE_CHECKING:  # imported by pytest_plugins below, where pytest can rewrite its asserts
    from supervisor.pytest_plugin import Supervisors

pytest_plugins = ["supervisor.pytest_plugin"]  # the entry point registers it only once installed

ROOT = Path(__file__).resolve().parent.parent
TEST_REGISTRY = "tests.crews:registry"
# Every supervisor of the suite: the test registry, heartbeats every 0.5 s, run from this tree, 300 s to be ready
# (a refused fork server means two cold imports of CrewAI before listening: 20 s quiet, minutes at load 10), its
# fork server warmed on the offline crews alone: ~2 s of CPU less a start (docs/tests.md); the modules whose crews
# call a provider warm the providers too, as a deployment does by default.
SETTINGS: dict[str, Any] = {
    "registry": TEST_REGISTRY,
    "heartbeat_seconds": 0.5,
    "cwd": ROOT,
    "ready_seconds": 300,
    "warmup": "offline",
}
WARM_PROVIDERS = {"AIP_CREWAI_WARMUP": "providers"}  # the default, for a supervisor whose crews call a provider


@pytest.fixture(scope="module")
def subreaper() -> Iterator[None]:
    """The test process adopts the orphans of this module's workers and supervisors, as the supervisor adopts a
    job's, until the module ends: then later modules' orphans go to init again, not to a pytest process that
    never reaps them (a zombie left with us looks alive to a check that does not reap it)."""
    become_subreaper()
    yield
    stop_being_subreaper()


def worker_env(tmp: Path, registry: str = TEST_REGISTRY) -> dict[str, str]:
    (tmp / "home").mkdir(exist_ok=True)
    return {
        **os.environ,
        **QUIET_CREWAI,
        "PYTHONPATH": str(ROOT),
        "AIP_CREWAI_REGISTRY": registry,
        "HOME": str(tmp / "home"),
        "CREWAI_STORAGE_DIR": str(tmp / "storage"),
        "AIP_CREWAI_WARMUP": "offline",  # a fork server started on it warms as the suite's supervisors do
    }


def gone(pid: int, create_time: float | None = None) -> bool:
    """True when no process, not even a zombie, holds ``pid`` (with that start time, if given).

    A zombie adopted by this process (a subreaper) is reaped first, as the supervisor would.
    """
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    try:
        process = psutil.Process(pid)
        return create_time is not None and process.create_time() != create_time
    except psutil.NoSuchProcess:
        return True


def ours(server: Server, pid: int) -> psutil.Process:
    """``pid``, checked alive (not a zombie) and a descendant of ``server``'s supervisor: what a later
    ``gone`` is about (a pid that never existed, or another's, is gone as well). Its start time is kept."""
    process = psutil.Process(pid)
    assert process.status() != psutil.STATUS_ZOMBIE, f"{pid} has already exited"
    assert any(parent.pid == server.pid for parent in process.parents()), f"{pid} is not the supervisor's"
    return process


def gone_for_good(process: psutil.Process, timeout: float = 10) -> bool:
    """``process`` (from ``ours``) no longer exists, not even as a zombie, within ``timeout``."""
    return wait_until(lambda: gone(process.pid, process.create_time()), timeout=timeout)


def start_server(
    state: Path,
    *,
    env: dict[str, str] | None = None,
    wait: bool = True,
    registry: str = TEST_REGISTRY,
    pass_fds: Sequence[int] = (),
    python: str = sys.executable,
    path: Sequence[str] = (),
    port: int = 0,
    token: str | None = None,
    user: tuple[int, int] | None = None,
) -> Server:
    """A supervisor on the test registry, with ``SETTINGS``; ``env`` wins. ``python`` runs it (and its workers),
    with ``path`` after this tree on its import path; a restart passes the ``port`` and ``token`` its clients
    know; ``user`` runs it as that uid and gid. Started by the plugin's factory: shut down, and its processes
    checked gone, when the test that started it ends (``stop_server`` for a fixture's)."""
    evidence = (env or {}).get("CREW_TEST_EVIDENCE_DIR")  # tests/crews/base.py EVIDENCE_DIR
    if evidence and "AIP_CREWAI_WORKER_WRITABLE" not in (env or {}):  # the crews leave it there, from their sandbox
        env = {**(env or {}), "AIP_CREWAI_WORKER_WRITABLE": evidence}
    options = {**SETTINGS, "registry": registry, "path": [ROOT, *path], "port": port, "token": token, "user": user}
    return _factory.start(state, env=env, wait=wait, pass_fds=pass_fds, python=python, **options)


def stop_server(server: Server) -> None:
    """Shut down a server ``start_server`` started, and check that nothing of it is left."""
    _factory.stop(server)


# The session's factory, kept for start_server: a plain function, called in tests and in fixtures of every scope.
_factory: Supervisors


@pytest.fixture(scope="session", autouse=True)
def _keep_the_factory(crew_supervisor_factory: Supervisors) -> None:
    global _factory
    _factory = crew_supervisor_factory


@pytest.fixture(scope="session")
def crew_supervisor_settings() -> dict[str, Any]:
    return dict(SETTINGS)


@pytest.fixture(autouse=True)
def _stop_servers_a_test_started(crew_supervisor_factory: Supervisors) -> Iterator[None]:
    """A test that fails half-way must not leave its supervisor (and its workers) running: those it started
    are killed and checked gone. Those of wider fixtures were running before it; they stop with them."""
    before = list(crew_supervisor_factory.running)
    yield
    crew_supervisor_factory.stop(*(s for s in crew_supervisor_factory.running if s not in before), kill=True)


@pytest.fixture(scope="module")
def server(crew_supervisor_module: Server) -> Server:
    """The module's shared supervisor: the plugin's, with this suite's settings (and launcher, in integration)."""
    return crew_supervisor_module


@pytest.fixture(scope="module")
def provider() -> Iterator[Provider]:
    """The module's loopback OpenAI-compatible provider, for crews on CrewAI's own ``LLM`` class: give its
    ``url`` to a supervisor as ``CREW_PROVIDER_URL`` (``worker.demo.provider_llm``). It knows the tests'
    directives too (``tests.helpers.scripted_provider``)."""
    with scripted_provider() as running:
        yield running


@pytest.fixture
def base() -> Iterator[Path]:
    """A directory every uid may traverse (pytest's own are 0700 root): for places another user must reach."""
    made = Path(tempfile.mkdtemp(prefix="traversable-"))
    made.chmod(0o711)
    yield made
    shutil.rmtree(made, ignore_errors=True)


@pytest.fixture(scope="module")
def evidence(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where a module's crews leave their evidence (``EVIDENCE_DIR`` in ``tests/crews/base.py``)."""
    return tmp_path_factory.mktemp("evidence")


def start_hostile_server(state: Path, evidence: Path, **settings: str) -> Server:
    """A supervisor for the hostile crews (``tests/crews/hostile.py``), sampling limits every 50 ms, its crews
    leaving their evidence (pids, counts) in ``evidence``; ``settings`` are AIP_CREWAI_* names."""
    env = {
        "AIP_CREWAI_MAX_CONCURRENCY": "4",
        "AIP_CREWAI_LIMIT_SAMPLE_MS": "50",
        "CREW_TEST_EVIDENCE_DIR": str(evidence),
        **{f"AIP_CREWAI_{name}": value for name, value in settings.items()},
    }
    return start_server(state, env=env)


def sse_events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """Whole events of an SSE body, each checked against its frame's ``event`` and ``id`` fields."""
    for frame in sse.frames(sse.lines(response.iter_bytes())):
        event = frame.json()
        assert event["event"] == frame.event
        if frame.id is not None:
            assert int(frame.id) == event["sequence"]
        yield event


def start_body(crew: str, action: str, **extra: Any) -> dict[str, Any]:
    return {"crew_id": crew, "action_id": action, **extra}


def run_with_neighbour(server: Server, body: dict[str, Any], status: int = 502) -> dict[str, Any]:
    """Run a job (expecting ``status``) while a normal job streams beside it; the neighbour must complete.
    Returns the job's terminal event data (empty while it has none)."""
    neighbour: dict[str, httpx.Response] = {}

    def run_neighbour() -> None:
        beside = start_body("demo-slow", f"{body['action_id']}-neighbour", input={"seconds": 1})
        with server.client() as client:
            neighbour["response"] = client.post("/jobs", json=beside, headers={"Idempotency-Key": "neighbour"})

    thread = threading.Thread(target=run_neighbour)
    thread.start()
    with server.client() as client:
        answer = client.post("/jobs", json=body, headers={"Idempotency-Key": "job"})
        assert answer.status_code == status, answer.text
        terminal = client.get(f"/jobs/{body['action_id']}").json()["terminal"]
    thread.join(60)
    assert neighbour["response"].status_code == 200, neighbour["response"].text
    return dict(terminal or {})


def release_once_sampled(server: Server, action: str, processes: int, release: Path) -> Future[None]:
    """Creates ``release`` once the supervisor's limit sampler has counted ``processes`` processes in the
    tree of ``action``'s worker (``GET /workers``), from a thread: for a crew that waits for that word before
    it goes on. The future fails if the job ended first, or neither happened within 60 s."""

    def release_when_counted() -> None:
        with server.client() as client:

            def counted() -> bool:
                workers = client.get("/workers").json()["workers"]
                return any(w["action_id"] == action and (w["processes"] or 0) >= processes for w in workers)

            def ended() -> bool:
                job = client.get(f"/jobs/{action}")
                return job.status_code == 200 and job.json()["terminal"] is not None

            assert wait_until(lambda: counted() or ended(), timeout=60), f"{action} never ran"
            assert not ended(), f"{action} ended before a sample counted {processes} of its processes"
        release.touch()

    pool = ThreadPoolExecutor(1)
    released = pool.submit(release_when_counted)
    pool.shutdown(wait=False)  # the thread runs on until it has released (or given up)
    return released


def memory_stop_checked(client: httpx.Client, terminal: dict[str, Any], limit_mb: int) -> str:
    """A memory hog's terminal event, with the evidence of whichever limit holds on this server (its
    ``/health`` says): the kernel's cgroup cap, or sampling. Returns which one."""
    enforced = client.get("/health").json()["memory_limit"]
    assert terminal["error_type"] == "memory_limit_exceeded" and terminal["signal"] == "SIGKILL"
    limit = limit_mb * 1024 * 1024
    assert terminal["limit_bytes"] == limit
    if enforced == "cgroup":  # the kernel's OOM killer stopped it at the cap; its charge peaked there
        assert terminal["enforced_by"] == "cgroup" and terminal["oom_kills"] >= 1
        assert terminal["memory_bytes"] >= 0.9 * limit
    else:  # a sample caught it past the limit
        assert enforced == "sampled" and terminal["enforced_by"] == "sampling"
        assert terminal["memory_bytes"] > limit and terminal["peak_rss_bytes"] >= terminal["memory_bytes"]
    return str(enforced)


def reaped_orphan(pid: int, timeout: float) -> int | None:
    """The wait status of ``pid``, an orphan adopted by this test process (a subreaper), once it has
    exited and is reaped here; None if it still runs after ``timeout``."""
    statuses: list[int] = []

    def reaped() -> bool:
        found, status = os.waitpid(pid, os.WNOHANG)
        statuses.append(status)
        return found == pid

    return statuses[-1] if wait_until(reaped, timeout=timeout) else None
