"""Chaos harness: keep jobs flowing, SIGKILL the supervisor at random moments, restart, check invariants.

    scripts/chaos --iterations 20 --seed 7 --concurrency 4 [--kill-workers]

After every restart it checks that: every acknowledged admission is present; nothing is `running`
(no job without a live worker); every job the crash interrupted is `failed` with
`uncertain_outcome: true`; no worker from before the restart is alive; every job's events are
contiguous from 0 with exactly one terminal event, last; exact repeats never made a second worker;
the journal passes SQLite's integrity check. Prints a summary and exits 1 on any violation.
"""

from __future__ import annotations

import argparse
import random
import secrets
import sqlite3
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from supervisor import testing
from supervisor.testing import Server

TERMINAL = ("completed", "failed", "cancelled")


@dataclass
class Tally:
    iterations: int = 0
    supervisor_kills: int = 0
    worker_kills: int = 0
    admitted: int = 0
    repeats: int = 0
    cancels: int = 0
    interrupted: set[str] = field(default_factory=set)
    orphans: set[str] = field(default_factory=set)
    violations: list[str] = field(default_factory=list)


def start_supervisor(state: Path, registry: str, concurrency: int) -> Server:
    """Every start (the first and each restart) appends to one log beside the state directory."""
    log = state.parent / "supervisor.log"
    try:
        return testing.start(state, registry, args=["--log-level", "warning"], log=log, max_concurrency=concurrency)
    except testing.StartError as exc:
        raise SystemExit(str(exc)) from None


class Load:
    """Client threads doing what users do: start (blocking or streamed), repeat exactly, cancel."""

    def __init__(
        self, sup: Server, rng: random.Random, concurrency: int, tally: Tally, acked: dict[str, dict[str, Any]]
    ) -> None:
        self.sup, self.rng, self.tally, self.acked = sup, rng, tally, acked
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.loop, args=(i,), daemon=True) for i in range(concurrency)]

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(10)

    def loop(self, index: int) -> None:
        rng = random.Random(self.rng.random())
        with self.sup.client(timeout=30) as client:
            while not self.stop.is_set():
                try:
                    self.step(client, rng, index)
                except httpx.TransportError:
                    time.sleep(0.05)  # the supervisor is being killed or restarted

    def step(self, client: httpx.Client, rng: random.Random, index: int) -> None:
        roll = rng.random()
        with self.lock:
            known = list(self.acked.items())
        if known and roll < 0.2:
            action, body = rng.choice(known)
            response = client.post("/jobs", json=body, headers={"Idempotency-Key": action}, timeout=3)
            if response.status_code not in (200, 409, 502, 504):
                self.violation(f"exact repeat of {action} answered {response.status_code}")
            self.tally.repeats += 1
        elif known and roll < 0.35:
            action, body = rng.choice(known)
            client.post(f"/jobs/{action}/cancel", json={"crew_id": body["crew_id"], "action_id": action}, timeout=10)
            self.tally.cancels += 1
        else:
            action = f"chaos-{index}-{secrets.token_hex(4)}"
            slow = rng.random() < 0.5
            body = {
                "crew_id": "demo-slow" if slow else "demo",
                "action_id": action,
                "input": {"seconds": rng.choice([1, 2, 5])} if slow else {},
            }
            with client.stream("POST", "/jobs/stream", json=body, headers={"Idempotency-Key": action}) as response:
                if response.status_code != 200:
                    self.violation(f"start of {action} answered {response.status_code}")
                    return
                with self.lock:  # the response line means the admission was durable
                    self.acked[action] = body
                    self.tally.admitted += 1
                if rng.random() < 0.7:
                    return  # hang up at once: a disconnect never cancels the job
                for _ in response.iter_lines():
                    if self.stop.is_set() or rng.random() < 0.01:
                        return

    def violation(self, text: str) -> None:
        with self.lock:
            self.tally.violations.append(text)


def check(
    sup: Server, acked: dict[str, dict[str, Any]], before: list[tuple[int, float]], state: Path, tally: Tally
) -> None:
    def fail(text: str) -> None:
        tally.violations.append(f"iteration {tally.iterations}: {text}")

    for pid, started in before:
        try:
            if psutil.Process(pid).create_time() == started:
                fail(f"worker {pid} from before the restart is alive")
        except psutil.NoSuchProcess:
            pass
    with sup.client(timeout=30) as client:
        for action in acked:
            record = client.get(f"/jobs/{action}")
            if record.status_code != 200:
                fail(f"acknowledged job {action} is missing ({record.status_code})")
                continue
            job = record.json()
            if job["status"] == "running":
                fail(f"{action} is running after restart with no worker")
            events = client.get(f"/jobs/{action}/events").json()["events"]
            names = [e["event"] for e in events]
            if [e["sequence"] for e in events] != list(range(len(events))):
                fail(f"{action} has non-contiguous sequences")
            if sum(n in TERMINAL for n in names) != 1 or names[-1] not in TERMINAL:
                fail(f"{action} does not end with exactly one terminal event: {names[-3:]}")
            if names.count("started") > 1:
                fail(f"{action} started more than one worker")
            terminal = events[-1]["data"] if events else {}
            if terminal.get("error_type") == "supervisor_restarted":
                tally.interrupted.add(action)
                if terminal.get("orphan_killed"):
                    tally.orphans.add(action)
                if terminal.get("uncertain_outcome") is not True:
                    fail(f"{action} was interrupted but is not marked uncertain")
    db = sqlite3.connect(f"file:{state / 'journal.db'}?mode=ro", uri=True)
    try:
        (result,) = db.execute("PRAGMA quick_check").fetchone()
    finally:
        db.close()
    if result != "ok":
        fail(f"journal integrity check: {result}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--kill-workers", action="store_true", help="also SIGKILL random workers mid-job")
    parser.add_argument("--registry", default="worker.demo:registry", help="needs crews 'demo' and 'demo-slow'")
    parser.add_argument("--state", type=Path, default=None, help="state directory (default: a temporary one)")
    args = parser.parse_args()

    seed = args.seed if args.seed is not None else random.randrange(2**32)
    rng = random.Random(seed)
    root = args.state or Path(tempfile.mkdtemp(prefix="crew-chaos-"))
    state = root / "state"
    tally = Tally()
    acked: dict[str, dict[str, Any]] = {}
    print(f"chaos: seed {seed}, {args.iterations} iterations, concurrency {args.concurrency}, state {state}")
    sup = start_supervisor(state if state.exists() else _make(state), args.registry, args.concurrency)
    for iteration in range(1, args.iterations + 1):
        tally.iterations = iteration
        with Load(sup, rng, args.concurrency, tally, acked):
            deadline = time.monotonic() + rng.uniform(0.5, 2.5)
            while time.monotonic() < deadline:
                time.sleep(0.1)
                victims = sup.processes()
                if args.kill_workers and victims and rng.random() < 0.05:
                    rng.choice(victims).kill()
                    tally.worker_kills += 1
            before = [(p.pid, p.create_time()) for p in sup.processes()]
            sup.kill()
            tally.supervisor_kills += 1
        sup = start_supervisor(state, args.registry, args.concurrency)
        check(sup, acked, before, state, tally)
        print(f"  iteration {iteration}: {len(acked)} jobs so far, {len(tally.violations)} violations", flush=True)
    sup.stop()

    rows = [
        ("iterations", tally.iterations),
        ("supervisor kills", tally.supervisor_kills),
        ("worker kills", tally.worker_kills),
        ("jobs admitted", tally.admitted),
        ("exact repeats", tally.repeats),
        ("cancels", tally.cancels),
        ("jobs interrupted by a crash", len(tally.interrupted)),
        ("orphans found at restart", len(tally.orphans)),
        ("invariant violations", len(tally.violations)),
    ]
    print("\n".join(f"{name:<30}{value:>8}" for name, value in rows))
    for violation in tally.violations[:50]:
        print(f"VIOLATION {violation}")
    return 1 if tally.violations else 0


def _make(state: Path) -> Path:
    state.mkdir(mode=0o700, parents=True)
    return state


if __name__ == "__main__":
    sys.exit(main())
