"""A job's LLM budget: the supervisor's (WORKER_MAX_TOKENS, WORKER_MAX_LLM_CALLS) or its crew's own where lower,
sent to the worker with its Start, and a job over it stopped as for any broken limit, with the evidence."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import gone
from tests.supervisor.jobs.harness import core, identity, in_loop

SPENDING = ["started", "spend", "spend", "spend", "spend", "hang"]  # 15 tokens a call


@pytest.mark.parametrize(
    ("settings", "reason", "evidence"),
    [
        ({"worker_max_tokens": "40"}, "token_limit_exceeded", {"tokens": 45, "llm_calls": 3, "limit": 40}),
        ({"worker_max_llm_calls": "2"}, "llm_call_limit_exceeded", {"tokens": 45, "llm_calls": 3, "limit": 2}),
    ],
    ids=["tokens", "calls"],
)
@in_loop
async def test_a_job_over_its_budget_is_stopped_with_the_evidence(
    tmp_path: Path, settings: dict[str, str], reason: str, evidence: dict[str, Any]
) -> None:
    async with core(tmp_path, **settings) as it:
        await it.start(SPENDING)
        event, data = await it.settled()
        assert event == "failed" and data["reason"] == data["error_type"] == reason, data
        assert {key: data[key] for key in evidence} == evidence and data["model"] == "scripted-model"
        assert data["uncertain_outcome"] is True and data["stop_confirmed"] is True and data["signal"] == "SIGKILL"
        assert gone(*identity(it))
        job = it.journal.reader.get("job")
        assert job is not None and job.status == "failed"


@pytest.mark.parametrize(
    ("own", "settings", "budget"),
    [
        ({"max_tokens": 20, "max_llm_calls": 9}, {"worker_max_tokens": "1000"}, [20, 9]),  # the crew's, lower
        ({"max_tokens": 5000}, {"worker_max_tokens": "40", "worker_max_llm_calls": "7"}, [40, 7]),  # never more
        ({"max_tokens": "lots", "max_llm_calls": -1}, {"worker_max_tokens": "40"}, [40, 0]),  # no counts: not taken
        ({}, {}, [0, 0]),
    ],
)
@in_loop
async def test_the_lower_budget_holds_and_the_worker_is_given_it(
    tmp_path: Path, own: dict[str, Any], settings: dict[str, str], budget: list[int]
) -> None:
    async with core(tmp_path, budgets={"scripted": own}, **settings) as it:
        await it.start(["started", "complete"])
        event, data = await it.settled()
        assert event == "completed" and data["budget"] == budget


@in_loop
async def test_a_worker_that_holds_a_call_back_is_stopped_as_over_that_budget(tmp_path: Path) -> None:
    async with core(tmp_path, worker_max_llm_calls="2") as it:
        await it.start(["started", "spend", "spend", "over-budget:max_llm_calls", "hang"])
        event, data = await it.settled()
        assert event == "failed" and data["reason"] == "llm_call_limit_exceeded"
        assert (data["llm_calls"], data["limit"]) == (2, 2) and data["stop_confirmed"] is True


@pytest.mark.parametrize("limit", ["max_dollars", "max_tokens"])  # no such limit; one this job was not given
@in_loop
async def test_a_hold_for_a_limit_the_job_has_not_is_a_protocol_fault(tmp_path: Path, limit: str) -> None:
    async with core(tmp_path, worker_max_llm_calls="5") as it:
        await it.start(["started", f"over-budget:{limit}", "hang"])
        event, data = await it.settled()
        assert event == "failed" and data["reason"] == "protocol_error" and data["stop_confirmed"] is True
        assert repr(limit) in data["message"]


@in_loop
async def test_a_job_within_its_budget_completes(tmp_path: Path) -> None:
    async with core(tmp_path, worker_max_tokens="45", worker_max_llm_calls="3") as it:
        await it.start(["started", "spend", "spend", "spend", "complete"])  # 45 tokens in 3 calls: at, not over
        assert (await it.settled())[0] == "completed"
