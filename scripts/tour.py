"""A scripted tour of crew-supervisor with the offline demo crews: run, stream, cancel with proof.

Starts ``crew-supervisor serve --demo`` on loopback with a fresh token, and a loopback OpenAI-compatible
provider for the demo's crews on CrewAI's own ``LLM`` class; walks through the API with httpx, then stops
both. ``--serve`` keeps them running afterwards for your own requests.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from supervisor import testing
from supervisor.config import DEMO_REGISTRY
from supervisor.console import sse
from supervisor.enums import EventName
from worker.provider import URL_ENV, Provider

Event = dict[str, Any]


def say(text: str) -> None:
    print(f"\n\033[1m== {text}\033[0m", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--serve", action="store_true", help="keep the supervisor running after the tour")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (default: a free one)")
    parser.add_argument("--keep", action="store_true", help="keep the state directory and the log after the tour")
    args = parser.parse_args()

    port = args.port or testing.free_port()
    root = Path(tempfile.mkdtemp(prefix="crew-supervisor-demo-"))
    log = root / "supervisor.log"
    provider = Provider().start()
    say(f"starting: crew-supervisor serve --demo --port {port}   (state in {root / 'state'}, log in {log})")
    print(f"the demo-llm crews' provider (OpenAI's chat completions, on loopback): {URL_ENV}={provider.url}")
    try:
        server = testing.start(
            root / "state",
            DEMO_REGISTRY,
            args=["--log-level", "warning"],
            log=log,
            port=port,
            env={URL_ENV: provider.url},
        )
    except testing.StartError as exc:
        provider.stop()
        sys.exit(f"{exc}\n(kept {root} for its log)")
    try:
        with server.client() as client:
            greet(server, client)
            tour(client)
            provider_tour(client, provider)
        if args.serve:
            say(f"serving on {server.url} — press Ctrl-C to stop")
            print(f"  export TOKEN={server.token}")
            print(f'  curl -H "Authorization: Bearer $TOKEN" {server.url}/health')
            server.process.wait()
    except KeyboardInterrupt:
        pass
    except sse.StreamError as exc:  # one line, as everything else the tour reports
        sys.exit(f"tour: {exc} (kept {root} for its log)")
    finally:
        server.stop()
        provider.stop()
    if args.keep:
        say(f"done: the supervisor and the provider stopped; its state and log are kept in {root}")
    else:
        shutil.rmtree(root)
        say(f"done: the supervisor and the provider stopped, and {root} is removed (--keep keeps it)")
    return 0


def greet(server: testing.Server, client: httpx.Client) -> None:
    health = client.get("/health").json()
    print(f"ready: crews {health['crews']}, operations {health['operations']}")
    print(f"without the token: HTTP {httpx.get(f'{server.url}/health', trust_env=False).status_code}")


def tour(client: httpx.Client) -> None:
    say("1. run: POST /jobs (blocking) — one worker process runs the demo crew")
    started = time.monotonic()
    body = {"crew_id": "demo", "action_id": "tour-run", "input": {"topic": "process supervision"}}
    output = client.post("/jobs", json=body, headers={"Idempotency-Key": "tour-1"}).json()
    print(
        f"raw: {output['raw']!r}  tokens: {output['token_usage']['total_tokens']}  "
        f"({time.monotonic() - started:.2f} s, in a worker the fork server forked for this job)"
    )
    ran = job_events(client, "tour-run")
    client.post("/jobs", json=body, headers={"Idempotency-Key": "tour-1"})
    repeated = job_events(client, "tour-run")
    print(
        f"exact repeat returns the same job, no second worker: {one_worker(ran, repeated)}"
        f" (started events' worker pids: {started_pids(ran)} after the run, {started_pids(repeated)} after the repeat)"
    )

    say("2. stream: POST /jobs/stream — server-sent events as the crew works")
    body = {"crew_id": "demo", "action_id": "tour-stream", "input": {"topic": "durable jobs"}}
    with client.stream("POST", "/jobs/stream", json=body, headers={"Idempotency-Key": "tour-2"}) as response:
        for event in sse.events(sse.lines(response.iter_bytes())):
            if event["event"] == EventName.CHUNK:
                print(event["data"]["content"], end="", flush=True)
            elif event["event"] == EventName.COMPLETED:  # its data is the output itself, as the reference writes it
                print(f"\n[{event['sequence']}] completed: raw {event['data']['raw']!r}", flush=True)
            else:
                print(f"\n[{event['sequence']}] {event['event']}", flush=True)

    say("3. cancel with proof: demo-slow ticks every 100 ms until we cancel it")
    body = {"crew_id": "demo-slow", "action_id": "tour-cancel", "input": {"seconds": 600}}
    ticking = threading.Event()
    pid: list[int] = []

    def follow() -> None:
        with client.stream("POST", "/jobs/stream", json=body, headers={"Idempotency-Key": "tour-3"}) as response:
            for event in sse.events(sse.lines(response.iter_bytes())):
                if event["event"] == EventName.STARTED:
                    pid.append(event["data"]["pid"])
                    print(f"[{event['sequence']}] started in worker pid {pid[0]}")
                elif event["event"] == EventName.CHUNK:
                    print(f"  {event['data']['content'].strip()}", flush=True)
                    if event["sequence"] >= 10:
                        ticking.set()
                else:
                    print(f"[{event['sequence']}] {event['event']}")

    follower = threading.Thread(target=follow)
    follower.start()
    ticking.wait(120)
    print(f"worker pid {pid[0]} alive before cancel: {psutil.pid_exists(pid[0])}")
    cancel = {"crew_id": "demo-slow", "action_id": "tour-cancel", "reason": "shown in the tour"}
    record = client.post("/jobs/tour-cancel/cancel", json=cancel).json()
    follower.join(30)
    proof = record["terminal"]
    print(
        f"status: {record['status']}; proof: stop_confirmed={proof['stop_confirmed']} signal={proof['signal']} "
        f"exit_status={proof['exit_status']} descendants_killed={proof['descendants_killed']} "
        f"elapsed_ms={proof['elapsed_ms']}"
    )
    print(f"psutil after cancel: pid {pid[0]} exists = {psutil.pid_exists(pid[0])}")


def provider_tour(client: httpx.Client, provider: Provider) -> None:
    say("4. a crew on CrewAI's own LLM class: the openai SDK over HTTP, as production crews call their provider")
    before = len(provider.calls)
    body = {"crew_id": "demo-llm", "action_id": "tour-llm", "input": {"topic": "real providers"}}
    started = time.monotonic()
    output = client.post("/jobs", json=body, headers={"Idempotency-Key": "tour-4"}).json()
    calls = provider.calls[before:]
    print(
        f"raw: {output['raw']!r} ({time.monotonic() - started:.2f} s); the provider answered {len(calls)} "
        f"call(s), streamed: {[call.stream for call in calls]}"
    )

    say("5. cancel a job while its provider holds the call (demo-llm-hang: the provider never answers)")
    before = len(provider.calls)
    body = {"crew_id": "demo-llm-hang", "action_id": "tour-llm-cancel", "input": {}}
    follower = threading.Thread(target=lambda: client.post("/jobs", json=body, headers={"Idempotency-Key": "tour-5"}))
    follower.start()
    (call,) = provider.wait(lambda calls: len(calls) > before, 120)[before:]
    print("the provider holds the call: nothing will answer it")
    cancelled = time.monotonic()
    cancel = {"crew_id": "demo-llm-hang", "action_id": "tour-llm-cancel", "reason": "a runaway provider call"}
    record = client.post("/jobs/tour-llm-cancel/cancel", json=cancel).json()
    follower.join(30)
    provider.wait(lambda calls: calls[before].hung_up is not None, 30)
    proof = record["terminal"]
    print(f"status: {record['status']}; stop_confirmed={proof['stop_confirmed']} pid {proof['pid']} {proof['signal']}")
    print(
        f"the provider saw its connection closed {1000 * (call.hung_up - cancelled):.0f} ms after the cancel "  # type: ignore[operator]
        "(an in-process sidecar's thread would keep it open until the provider answered)"
    )
    # What the host reconciles before any new run: the call was out when the cancel came (docs/reconcile-and-resume.md).
    calls = [
        f"{e['kind']} {e['name']}: {e['status']}" for e in client.get("/jobs/tour-llm-cancel/effects").json()["effects"]
    ]
    print(
        f"its effect ledger: {'; '.join(calls)} (crew-supervisor effects tour-llm-cancel; reconcile what is uncertain)"
    )


def job_events(client: httpx.Client, action: str) -> list[Event]:
    """Every event the journal holds for a settled job: its SSE stream from cursor 0 ends after the terminal one."""
    headers = {"Accept": "text/event-stream"}
    with client.stream("GET", f"/jobs/{action}/events", params={"cursor": 0}, headers=headers) as response:
        return list(sse.events(sse.lines(response.iter_bytes())))


def started_pids(events: list[Event]) -> list[int]:
    """The pid of each worker that started on the job, from its started events."""
    return [event["data"]["pid"] for event in events if event["event"] == EventName.STARTED]


def one_worker(ran: list[Event], repeated: list[Event]) -> bool:
    """A job's events after its run and again after an exact repeat: still one started event, the same pid.

    Not the outputs' equality: the demo crew is deterministic, so a second run would answer the same."""
    return len(started_pids(repeated)) == 1 and started_pids(ran) == started_pids(repeated)


if __name__ == "__main__":
    sys.exit(main())
