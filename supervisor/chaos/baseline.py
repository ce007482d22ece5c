"""Before the load and its faults, one job of each crew the clients start, each run to its end: what a crew does
unharmed is then in the report however few of the load's own jobs the machine lets finish. Those end as a fault, a
cancel or the stop at the end of an iteration finds them, so on a loaded machine none may get to its answer: a crew
that leaves processes behind on each answer would show none left, one that fails on each would show no failure."""

from __future__ import annotations

import secrets
from typing import Any

import httpx

from supervisor.chaos.crews import Crews
from supervisor.chaos.load import EFFECTS_STEP_SECONDS

BASELINE_SECONDS = 120.0  # a crew's job unharmed takes a few seconds; past this its answer is a finding
# A blocking start's answers that carry (or, 200, complete) the admitted job: its record is checked as every job's.
ADMITTED = (200, 409, 502, 504)


def baseline_bodies(crews: Crews) -> list[dict[str, Any]]:
    """A start of the fast crew, of the slow one asked for 1 s, and of the effects crew if there is one."""
    starts = [(crews.fast, crews.input(False, 0)), (crews.slow, crews.input(True, 1))]
    bodies = [
        {"crew_id": crew, "action_id": f"chaos-baseline-{secrets.token_hex(4)}", "input": value}
        for crew, value in starts
    ]
    if crews.effects:
        action = f"chaos-baseline-{secrets.token_hex(4)}"
        effects_input = {"marker": action, "seconds": EFFECTS_STEP_SECONDS}
        bodies.append({"crew_id": crews.effects, "action_id": action, "input": effects_input})
    return bodies


def run_baseline(client: httpx.Client, bodies: list[dict[str, Any]], acked: dict[str, dict[str, Any]]) -> list[str]:
    """Start each of ``bodies`` and wait for its end (a blocking ``POST /jobs``), one after the other; each
    job admitted joins ``acked``. Returns what is wrong with the answers (its record's rules are the checks')."""
    problems = []
    for body in bodies:
        action = body["action_id"]
        headers = {"Idempotency-Key": action}
        try:
            answer = client.post("/jobs", json=body, headers=headers, timeout=BASELINE_SECONDS)
        except httpx.TimeoutException:
            problems.append(f"baseline job {action} of {body['crew_id']} did not end in {BASELINE_SECONDS:.0f} s")
            continue
        except httpx.TransportError as exc:  # no fault runs yet: the supervisor went away on its own
            problems.append(f"baseline start of {action} got no answer: {exc!r}")
            continue
        if answer.status_code in ADMITTED:
            acked[action] = body
        else:
            problems.append(f"baseline start of {action} answered {answer.status_code}: {answer.text[:120]!r}")
    return problems
