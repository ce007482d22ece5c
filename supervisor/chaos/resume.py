"""After each restart, a few interrupted jobs of the effects crew resumed (``POST /jobs/{id}/resume``), each one
checked: it completes, its record names the old job, its ledger keeps the rules, and no task the old job completed
runs again: its tool calls are those of the tasks after them alone (the effects crew calls one tool a task), and it
counts every task as completed."""

from __future__ import annotations

from typing import Any

import httpx

from protocol import Effect, EffectStatus
from supervisor.chaos.checks import Findings, ledger_problems
from supervisor.chaos.crews import Crews
from supervisor.enums import Status

RESUMES_PER_RESTART = 2
RESUME_SECONDS = 120.0  # a resumed job's remaining steps take a few seconds; past this its answer is a finding
STOPPED = (Status.FAILED, Status.CANCELLED)


def resume_interrupted(
    client: httpx.Client, acked: dict[str, dict[str, Any]], crews: Crews, findings: Findings
) -> None:
    """Resume up to RESUMES_PER_RESTART ended jobs of the effects crew that did not complete (each once)."""
    if not crews.effects:
        return
    left = RESUMES_PER_RESTART
    for action, body in list(acked.items()):
        if left == 0:
            return
        if body["crew_id"] != crews.effects or action in findings.resumed or action not in findings.settled:
            continue
        if client.get(f"/jobs/{action}").json()["status"] not in STOPPED:
            findings.resumed[action] = ""  # it completed: nothing to resume
            continue
        findings.resumed[action] = new = f"{action}-r1"
        findings.add(resume_problems(client, action, new))
        left -= 1


def resume_problems(client: httpx.Client, old: str, new: str) -> list[str]:
    """Resume ``old`` as ``new`` and say what is wrong with what ran."""
    before = client.get(f"/jobs/{old}/effects").json()["tasks_completed"]
    try:
        answer = client.post(
            f"/jobs/{old}/resume", json={"action_id": new}, headers={"Idempotency-Key": new}, timeout=RESUME_SECONDS
        )
    except httpx.TimeoutException:
        return [f"resume of {old} as {new} did not answer in {RESUME_SECONDS:.0f} s"]
    if answer.status_code != 200:
        return [f"resume of {old} as {new} answered {answer.status_code}: {answer.text[:160]!r}"]
    tasks = len(answer.json().get("tasks_output") or [])
    ledger = client.get(f"/jobs/{new}/effects").json()
    problems = ledger_problems(new, ledger, own_tasks=tasks - before)
    tools = [entry["status"] for entry in ledger["effects"] if entry["kind"] == Effect.TOOL]
    if tools != [EffectStatus.FINISHED] * (tasks - before):
        problems.append(f"{new} resumed {old} after its {before} of {tasks} completed tasks, but its tools: {tools}")
    if ledger["tasks_completed"] != tasks:
        problems.append(f"{new} completed with {tasks} task outputs but counts {ledger['tasks_completed']} completed")
    if client.get(f"/jobs/{new}").json().get("resumed_from") != old:
        problems.append(f"{new}'s record does not name {old}, the job it resumed")
    return problems
