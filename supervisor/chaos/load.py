"""The clients: threads doing what users do (streamed starts that hang up or follow, exact repeats,
conflicting repeats, cancels) and the rules every answer must keep, each broken rule one line."""

from __future__ import annotations

import random
import secrets
import threading
import time
from typing import Any, Protocol

import httpx

from supervisor.chaos.crews import Crews
from supervisor.chaos.faults import Record
from supervisor.enums import Status


class Reachable(Protocol):
    """A supervisor the clients can reach: one chaos started, or a deployment at a URL."""

    def client(self, token: str | None = None, *, timeout: float = 60) -> httpx.Client: ...


REPEAT_SECONDS = 3.0  # a blocking repeat's wait: shorter than a slow job, so 504s and hang-ups happen too
REFUSED_PAUSE_SECONDS = 0.1
EFFECTS_ABOVE = 0.75  # a start rolled above this starts the effects crew: a quarter, taken from the fast jobs
EFFECTS_STEP_SECONDS = 0.5  # each step's tool call takes a while: a kill lands in one
JOIN_SECONDS = 60.0  # longest a client may stay in a request once the load stops (a cancel's wait included)
# An exact repeat answers what the job is now: 200 its output, else its record with the status that answer means.
REPEAT_STATUS = {409: Status.CANCELLED, 502: Status.FAILED, 504: Status.RUNNING}


def repeat_problem(action: str, code: int, body: Any, status: str | None) -> str | None:
    """What is wrong with an exact repeat's answer, given ``status``, the job's as read just after it (a
    job still running may have ended meanwhile; a terminal one never changes)."""
    wanted = Status.COMPLETED if code == 200 else REPEAT_STATUS.get(code)
    if wanted is None:
        return f"exact repeat of {action} answered {code}"
    if code != 200 and (not isinstance(body, dict) or body.get("action_id") != action or body.get("status") != wanted):
        seen = (body.get("action_id"), body.get("status")) if isinstance(body, dict) else body
        return f"exact repeat of {action} answered {code} without its job {wanted}: {seen!r}"
    if status != wanted and wanted != Status.RUNNING:
        return f"exact repeat of {action} answered {code} ({wanted}) but the journal says {status}"
    return None


def conflict_problem(action: str, code: int, body: Any) -> str | None:
    """A repeat with other material must be refused 409 as a conflict, never answered with the job."""
    if code != 409 or not isinstance(body, dict) or "action_id" in body:
        return f"conflicting repeat of {action} answered {code} {str(body)[:120]!r}, not a 409 conflict"
    return None


def start_problem(action: str, code: int, disk_full: bool) -> str | None:
    if code == 200 or (code == 507 and disk_full):
        return None
    return f"start of {action} answered {code}" + (" (disk not full)" if code == 507 else "")


def cancel_problem(action: str, code: int, body: Any) -> str | None:
    """A cancel answers once the job is terminal, with its record."""
    if code != 200 or not isinstance(body, dict) or body.get("action_id") != action:
        return f"cancel of {action} answered {code} {str(body)[:120]!r}"
    if body.get("status") == Status.RUNNING:
        return f"cancel of {action} answered while the job still runs"
    return None


class Load:
    """``concurrency`` client threads on ``sup`` until the ``with`` block ends; ``acked`` gathers every
    start whose admission was acknowledged (its response line arrived), ``violations`` every broken rule."""

    def __init__(
        self,
        sup: Reachable,
        rng: random.Random,
        concurrency: int,
        record: Record,
        acked: dict[str, dict[str, Any]],
        violations: list[str],
        crews: Crews,
    ) -> None:
        self.sup, self.record, self.acked, self.violations = sup, record, acked, violations
        self.crews = crews
        self.seeds = [rng.random() for _ in range(concurrency)]
        self.requests: dict[str, int] = {}
        self.stopping = threading.Event()
        self.stuck = False  # a client thread outlived the load: the run cannot go on
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.loop, args=(i,), daemon=True) for i in range(concurrency)]

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        deadline = time.monotonic() + JOIN_SECONDS
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if any(thread.is_alive() for thread in self.threads):
            self.stuck = True  # it would go on admitting jobs while the invariants are read
            self.check(f"a client thread was still in a request {JOIN_SECONDS:.0f} s after the load stopped")

    def loop(self, index: int) -> None:
        rng = random.Random(self.seeds[index])
        with self.sup.client(timeout=30) as client:
            while not self.stopping.is_set():
                try:
                    self.step(client, rng, index)
                except httpx.TransportError:  # the supervisor is being killed, frozen or restarted
                    self.count("transport errors")
                    self.stopping.wait(0.05)

    def step(self, client: httpx.Client, rng: random.Random, index: int) -> None:
        roll = rng.random()
        with self.lock:
            known = list(self.acked.items()) if roll < 0.4 else []
        if known and roll < 0.2:
            self.repeat(client, *rng.choice(known))
        elif known and roll < 0.25:
            self.conflict(client, *rng.choice(known))
        elif known:
            self.cancel(client, *rng.choice(known))
        else:
            self.start(client, rng, f"chaos-{index}-{secrets.token_hex(4)}")

    def start(self, client: httpx.Client, rng: random.Random, action: str) -> None:
        roll = rng.random()
        slow = roll < 0.5
        seconds = rng.choice([1, 2, 5]) if slow else 0
        crew = self.crews.slow if slow else self.crews.fast
        body = {"crew_id": crew, "action_id": action, "input": self.crews.input(slow, seconds)}
        if self.crews.effects and roll > EFFECTS_ABOVE:
            effects_input = {"marker": action, "seconds": EFFECTS_STEP_SECONDS}
            body = {"crew_id": self.crews.effects, "action_id": action, "input": effects_input}
        self.count("starts")
        begun = time.monotonic()
        with client.stream("POST", "/jobs/stream", json=body, headers={"Idempotency-Key": action}) as response:
            if response.status_code != 200:
                response.read()
                disk_full = self.record.disk_full_during(begun, time.monotonic())
                self.check(start_problem(action, response.status_code, disk_full))
                self.stopping.wait(REFUSED_PAUSE_SECONDS)  # as a client would, before it tries again
                return
            with self.lock:  # the response line means the admission was durable
                self.acked[action] = body
            if rng.random() < 0.7:
                return  # hang up at once: a disconnect never cancels the job
            for _ in response.iter_lines():
                if self.stopping.is_set() or rng.random() < 0.01:
                    return

    def repeat(self, client: httpx.Client, action: str, body: dict[str, Any]) -> None:
        self.count("exact repeats")
        headers = {"Idempotency-Key": action}
        try:
            answer = client.post("/jobs", json=body, headers=headers, timeout=REPEAT_SECONDS)
        except httpx.ReadTimeout:
            return  # the job still runs; a blocking start that outlives its client is fine
        status = client.get(f"/jobs/{action}").json().get("status")  # what the journal says now, to compare
        self.check(repeat_problem(action, answer.status_code, _json(answer), status))

    def conflict(self, client: httpx.Client, action: str, body: dict[str, Any]) -> None:
        self.count("conflicting repeats")
        changed = {**body, "input": {**body["input"], "changed": True}}
        answer = client.post("/jobs/stream", json=changed, headers={"Idempotency-Key": action}, timeout=10)
        self.check(conflict_problem(action, answer.status_code, _json(answer)))

    def cancel(self, client: httpx.Client, action: str, body: dict[str, Any]) -> None:
        self.count("cancels")
        answer = client.post(f"/jobs/{action}/cancel", json={"crew_id": body["crew_id"], "action_id": action})
        self.check(cancel_problem(action, answer.status_code, _json(answer)))

    def count(self, what: str) -> None:
        with self.lock:
            self.requests[what] = self.requests.get(what, 0) + 1

    def check(self, problem: str | None) -> None:
        if problem is not None:
            with self.lock:
                self.violations.append(problem)


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text
