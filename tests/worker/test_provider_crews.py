"""Crews on CrewAI's own ``LLM`` class, over HTTP to a loopback OpenAI-compatible provider (the openai SDK and
httpx, as in production): a job streams the provider's answer; a cancel, a timeout or a broken limit while the
provider holds the call kills the worker, and the provider sees the connection close; a provider that answers
429 or 500 fails the job with the error CrewAI itself raises in-process. The fork server says it warmed the path.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest

from supervisor.testing import Server
from tests.conftest import (
    ROOT,
    TEST_REGISTRY,
    WARM_PROVIDERS,
    gone,
    memory_stop_checked,
    sse_events,
    start_body,
    start_server,
    stop_server,
    wait_until,
    worker_env,
)
from tests.crews.base import HOG_RELEASE, LONG_WORDS
from tests.helpers.kickoff import comparable
from tests.supervisor.http.test_api import started_pid
from worker.provider import URL_ENV, Call, Provider

MEMORY_LIMIT_MB = 400  # a forked worker's RSS counts the fork server's pages (~200 MB); its PSS is far below
KEY = {"Idempotency-Key": "key"}
reason_limit = {"llm_call_limit_exceeded": "max_llm_calls", "token_limit_exceeded": "max_tokens"}


@pytest.fixture(scope="module")
def llm_server(provider: Provider, evidence: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    env = {
        **WARM_PROVIDERS,
        URL_ENV: provider.url,
        "CREW_TEST_EVIDENCE_DIR": str(evidence),
        "AIP_CREWAI_WORKER_MAX_MEMORY_MB": str(MEMORY_LIMIT_MB),
        "AIP_CREWAI_LIMIT_SAMPLE_MS": "50",
    }
    server = start_server(tmp_path_factory.mktemp("llm") / "state", env=env)
    yield server
    stop_server(server)


def calls_after(provider: Provider, before: int) -> list[Call]:
    return provider.calls[before:]


def held_call(provider: Provider, before: int) -> Call:
    """The job's provider call, once the provider holds it (read, not answered)."""
    calls = provider.wait(lambda calls: len(calls) > before, 60)
    return calls[before]


def live_worker(server: Server, client: Any, action: str) -> int:
    """The pid of ``action``'s worker (its ``started`` event), checked alive and the supervisor's own child
    before anything kills it."""
    pid = started_pid(client, action)
    assert psutil.Process(pid).ppid() == server.pid
    return pid


def test_the_fork_server_warmed_the_openai_provider_path(llm_server: Server) -> None:
    with llm_server.client() as client:
        forkserver = client.get("/health").json()["forkserver"]
    assert forkserver["refused"] is None
    assert {"openai", "openai-compatible"} <= set(forkserver["warmed"]["paths"])
    assert forkserver["warmed"]["tls_contexts"] > 0


def test_a_job_streams_the_provider_s_answer(llm_server: Server, provider: Provider) -> None:
    before = len(provider.calls)
    with (
        llm_server.client() as client,
        client.stream("POST", "/jobs/stream", json=start_body("llm", "llm-run"), headers=KEY) as response,
    ):
        events = list(sse_events(response))
    assert [e["event"] for e in events][:1] == ["started"] and events[-1]["event"] == "completed"
    output = events[-1]["data"]
    assert output["raw"].startswith("the provider reports finding ")
    # The provider records an answer's time after writing it: waited for, so a fast job cannot outrun the record.
    calls = provider.wait(lambda calls: all(call.answered for call in calls[before:]), 30)[before:]
    assert len(calls) == 2 and all(call.stream and call.answered for call in calls)  # a run streams: two tasks
    text = "".join(e["data"]["content"] for e in events if e["event"] == "chunk")
    assert output["raw"] in text and "Final Answer:" in text  # the provider's words, as CrewAI streamed them
    with llm_server.client() as client:  # CrewAI's warning on each call of a model it cannot count is not kept
        assert "approximate input token count" not in client.get("/jobs/llm-run/output").json()["stderr"]["text"]
    usage = output["token_usage"]  # as CrewAI counts: each agent reports the LLM it shares with the other
    assert usage["successful_requests"] == 4
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0


def test_a_long_answer_streams_whole_on_default_event_bounds(llm_server: Server) -> None:
    """3,000 chunks and more, on the default MAX_EVENTS_PER_RUN (1,000): past a quarter of its events, a job's text
    chunks are coalesced (worker/chunks.py), so it completes, every word delivered once and in order."""
    with (
        llm_server.client() as client,
        client.stream("POST", "/jobs/stream", json=start_body("llm-long", "llm-long"), headers=KEY) as response,
    ):
        events = list(sse_events(response))
    assert events[-1]["event"] == "completed", events[-1]
    chunks = [e for e in events if e["event"] == "chunk"]
    text = "".join(e["data"]["content"] for e in chunks)
    words = "".join(f" w{i}" for i in range(LONG_WORDS))
    assert events[-1]["data"]["raw"].endswith(words) and text.count(words) == 1  # whole, in order, once
    assert 250 <= len(chunks) < 1000 - 1  # the first quarter a chunk an event; the rest coalesced
    fields = set(chunks[0]["data"])
    assert all(set(e["data"]) == fields and e["data"]["chunk_type"] == "text" for e in chunks)  # the chunk shape


def test_a_cancel_while_the_provider_holds_the_call_closes_its_connection(
    llm_server: Server, provider: Provider
) -> None:
    before = len(provider.calls)
    body = start_body("llm-hang", "llm-cancel")
    with ThreadPoolExecutor(1) as pool, llm_server.client() as client:
        follower = pool.submit(_follow, llm_server, body)
        call = held_call(provider, before)
        pid = live_worker(llm_server, client, "llm-cancel")
        cancelled_at = time.monotonic()
        response = client.post("/jobs/llm-cancel/cancel", json={**body, "reason": "runaway provider call"})
        events = follower.result(60)
    record = response.json()
    assert response.status_code == 200 and record["status"] == "cancelled"
    assert record["terminal"]["stop_confirmed"] is True and record["terminal"]["pid"] == pid
    assert events[-1]["event"] == "cancelled"
    (seen,) = provider.wait(lambda calls: calls[before].hung_up is not None, 30)[before:]
    assert seen is call and call.answered is None and call.hung_up >= cancelled_at  # type: ignore[operator]
    assert gone(pid)


def test_a_timeout_while_the_provider_holds_the_call_closes_its_connection(
    llm_server: Server, provider: Provider
) -> None:
    before = len(provider.calls)
    # Its timeout runs from admission: 6 s leaves a loaded machine time to fork, build and make the call.
    body = start_body("llm-hang", "llm-timeout", timeout_ms=6000)
    events = _follow(llm_server, body)
    terminal = events[-1]
    assert terminal["event"] == "failed" and terminal["data"]["reason"] == "timeout"
    assert terminal["data"]["stop_confirmed"] is True

    # The provider sees the connection close on its own thread, a moment after the kill: waited for.
    def hung_up(calls: list[Call]) -> bool:  # the job's one call (a timeout before it would leave none), closed
        return len(calls) > before and all(call.hung_up for call in calls[before:])

    (call,) = provider.wait(hung_up, 30)[before:]
    assert call.hung_up is not None and call.answered is None
    assert call.hung_up - call.started < 6.0 + 30  # closed by the kill, not left open
    assert gone(terminal["data"]["pid"])


def test_a_limit_broken_while_the_provider_holds_the_call_closes_its_connection(
    llm_server: Server, provider: Provider, evidence: Path
) -> None:
    before = len(provider.calls)
    body = start_body("llm-hang-hog", "llm-hog")
    try:
        with ThreadPoolExecutor(1) as pool, llm_server.client() as client:
            follower = pool.submit(_follow, llm_server, body)
            call = held_call(provider, before)
            pid = live_worker(llm_server, client, "llm-hog")
            released_at = time.monotonic()
            (evidence / HOG_RELEASE).touch()  # only now does the crew start to allocate
            events = follower.result(120)
            terminal = events[-1]
            assert terminal["event"] == "failed"
            memory_stop_checked(client, terminal["data"], MEMORY_LIMIT_MB)
    finally:
        (evidence / HOG_RELEASE).unlink(missing_ok=True)
    provider.wait(lambda calls: calls[before].hung_up is not None, 30)
    assert call.answered is None and call.hung_up >= released_at  # type: ignore[operator]
    assert gone(pid)


def test_a_provider_that_fails_fails_the_job_with_crewai_s_own_error(
    llm_server: Server, provider: Provider, tmp_path: Path
) -> None:
    crews = ["llm-fail-429", "llm-fail-500"]
    before = len(provider.calls)
    expected = _in_process(crews, provider, tmp_path)
    in_process_calls = len(provider.calls) - before
    assert [line["error"].split(":")[0] for line in expected] == ["RateLimitError", "InternalServerError"]
    with llm_server.client() as client:
        for crew, reference in zip(crews, expected, strict=True):
            answer = client.post("/jobs", json=start_body(crew, crew), headers=KEY)
            assert answer.status_code == 502, answer.text
            terminal = client.get(f"/jobs/{crew}").json()["terminal"]
            assert terminal["error_type"] == reference["error"].split(":")[0]
            assert terminal["reason"] == "operation_failed"
    statuses = [call.status for call in provider.calls[before + in_process_calls :]]
    assert len(statuses) == in_process_calls  # the same calls, retries included, as in-process
    assert set(statuses) == {429, 500}


def test_a_job_s_llm_spend_is_counted_call_by_call_as_crewai_counts_it(llm_server: Server) -> None:
    """Each call counted as it completes: the totals of a finished job equal its own token_usage (each agent
    on an LLM of its own, where CrewAI counts each call once), in its log line and the metrics."""
    with llm_server.client() as client:
        answer = client.post("/jobs", json=start_body("llm-own", "spend-once"), headers=KEY)
        assert answer.status_code == 200, answer.text
        usage = answer.json()["token_usage"]
        assert wait_until(lambda: _finished(llm_server, "spend-once") is not None, timeout=30)
        finished = _finished(llm_server, "spend-once")
        metrics = client.get("/metrics").text
    assert usage["successful_requests"] == 2 and usage["total_tokens"] > 0
    assert (finished["tokens"], finished["llm_calls"]) == (usage["total_tokens"], usage["successful_requests"])
    for kind in ("prompt", "completion"):
        line = f'crew_supervisor_llm_tokens_total{{crew="llm-own",kind="{kind}"}} {float(usage[kind + "_tokens"])}'
        assert line in metrics, kind
    assert 'crew_supervisor_llm_calls_total{crew="llm-own"} 2.0' in metrics


def test_a_runaway_agent_s_spend_is_seen_live_while_it_runs(llm_server: Server, provider: Provider) -> None:
    """A provider that answers every call with another tool call: the spend grows in /workers as it runs, and the
    cancelled job's record keeps all of it."""
    body = start_body("llm-loop", "spend-live")
    with ThreadPoolExecutor(1) as pool, llm_server.client() as client:
        follower = pool.submit(_follow, llm_server, body)
        cancelled = None
        try:

            def spent() -> dict[str, Any]:
                workers = client.get("/workers").json()["workers"]
                return next((w for w in workers if w["action_id"] == "spend-live"), {"llm_calls": 0})

            assert wait_until(lambda: spent()["llm_calls"] >= 3, timeout=60), spent()
            first = spent()
            assert wait_until(lambda: spent()["llm_calls"] > first["llm_calls"], timeout=60)
            now = spent()
            assert now["tokens"] > first["tokens"] > 0 and now["model"].endswith("loop")
            assert now["tokens"] == now["prompt_tokens"] + now["completion_tokens"]
        finally:
            cancelled = client.post("/jobs/spend-live/cancel", json={**body, "reason": "enough spent"}).json()
            follower.result(60)
        kept = cancelled["llm_spent"]
        assert cancelled["status"] == "cancelled" and kept == cancelled["terminal"]["llm_spent"]
        assert (
            kept["llm_calls"] >= now["llm_calls"] and kept["tokens"] >= now["tokens"] and kept["model"] == now["model"]
        )
        assert client.get("/jobs/spend-live").json()["llm_spent"] == kept


@pytest.mark.parametrize(
    ("crew", "reason", "limit"),
    [("llm-loop-calls", "llm_call_limit_exceeded", 5), ("llm-loop-tokens", "token_limit_exceeded", 3000)],
)
def test_a_runaway_agent_is_stopped_at_its_budget_and_no_call_starts_after(
    llm_server: Server, provider: Provider, crew: str, reason: str, limit: int
) -> None:
    """Its crew's own budget (the supervisor sets none here): the provider sees no call after the budget."""
    before = len(provider.calls)
    with llm_server.client() as client:
        budgets = client.get("/health").json()["llm_budget"]
        answer = client.post("/jobs", json=start_body(crew, f"budget-{crew}"), headers=KEY)
    assert (budgets["max_tokens"], budgets["max_llm_calls"]) == (0, 0)
    assert budgets["crews"][crew] == {"max_tokens": 0, "max_llm_calls": 0, reason_limit[reason]: limit}
    assert answer.status_code == 502, answer.text
    terminal = answer.json()["terminal"]
    assert terminal["reason"] == terminal["error_type"] == reason and terminal["limit"] == limit
    assert terminal["uncertain_outcome"] is True and terminal["stop_confirmed"] is True
    assert terminal["model"].endswith("loop") and terminal["tokens"] > 0
    with llm_server.client() as client:  # its record keeps where it was just before the limit's kill
        kept = client.get(f"/jobs/budget-{crew}/stack").json()
    assert kept["status"] == "failed" and kept["before"] == "limit" and kept["threads"], kept
    if reason == "llm_call_limit_exceeded":  # the sixth call held back by the budget's hook, waiting to be stopped
        assert any("worker/spending.py" in thread["stack"] for thread in kept["threads"]), kept
    calls = calls_after(provider, before)
    if reason == "llm_call_limit_exceeded":  # five made; the sixth was held back before it started
        assert terminal["llm_calls"] == len(calls) == limit
    else:  # the call that crossed it was the last
        assert terminal["tokens"] > limit and terminal["llm_calls"] == len(calls) > 1


def test_a_crew_within_its_budget_gives_what_kickoff_gives(
    llm_server: Server, provider: Provider, tmp_path: Path
) -> None:
    (reference,) = _in_process(["llm-own-budget"], provider, tmp_path)
    with llm_server.client() as client:
        answer = client.post("/jobs", json=start_body("llm-own-budget", "budget-within"), headers=KEY)
    assert answer.status_code == 200, answer.text
    assert "error" not in reference, reference
    assert comparable(answer.json()) == comparable(reference)  # token_usage included


def _finished(server: Server, action_id: str) -> dict[str, Any] | None:
    """The supervisor's log line for the job's end."""
    for line in server.log.read_text(errors="replace").splitlines():
        if line.startswith("{") and f'"{action_id}"' in line:
            record = orjson.loads(line)
            if record.get("event") == "job finished" and record.get("action_id") == action_id:
                return dict(record)
    return None


def _follow(server: Server, body: dict[str, Any]) -> list[dict[str, Any]]:
    with server.client() as client, client.stream("POST", "/jobs/stream", json=body, headers=KEY) as response:
        return list(sse_events(response))


def _in_process(crews: list[str], provider: Provider, tmp_path: Path) -> list[dict[str, Any]]:
    """Each crew's ``kickoff()`` in a fresh interpreter (``tests.helpers.kickoff``): its output or its error."""
    jobs = orjson.dumps([[TEST_REGISTRY, crew, "run", {}] for crew in crews])
    env = {**worker_env(tmp_path), URL_ENV: provider.url}
    done = subprocess.run(
        [sys.executable, "-m", "tests.helpers.kickoff", "--each"],
        input=jobs,
        capture_output=True,
        env=env,
        cwd=ROOT,
        timeout=180,
        check=True,
    )
    return [orjson.loads(line) for line in done.stdout.splitlines()]
