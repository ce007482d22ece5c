"""A worker without CrewAI that plays its job's ``input["script"]``: a real process speaking the real protocol in
~50 ms, so the job core's every branch can be driven from a test (``tests/supervisor/jobs``).

``python scripted_worker.py job --parent-pid PID --cwd DIR``, as the spawn launcher starts ``python -m worker``.
Steps, in order: ``started``, ``chunk``, ``complete``, ``fail`` (a terminal, then the worker leaves as the real one
does), ``hang`` (until killed), ``exit:N`` (leave with status N, no terminal), ``close-events`` (close the event
pipe and run on), ``ignore-term`` (survive SIGTERM), ``tree`` (a child and a setsid grandchild; their pids go
to the file ``input["pids"]`` names), ``shout`` (64 KiB to stdout), ``late-chunk`` (a frame after the terminal),
``forge:REASON`` (a ``Failed`` with that reason, as crew code can write one),
``linger`` (stay 60 s after the terminal, then leave), ``await-go`` (until the file ``input["go"]`` names exists),
``spend`` (an LLM call's usage: 10 prompt and 5 completion tokens), ``refund`` (usage that takes 100 back),
``over-budget:LIMIT`` (hold a call back, as over that budget), ``await-dump`` (until a ``DumpStacks`` comes),
``stacks`` (one thread's, as a worker answers it), ``huge-stacks`` (an answer past every bound: a 100,000-character
name, an id that is no number, 1 MiB of stack ending in ``innermost call``). ``complete`` answers with the budget
its Start gave. The effect ledger: ``effect:KIND:NAME`` (the next entry's ``EffectStarted``, then wait for its
``Recorded``, each appended as ``recorded ID`` to the file ``input["acks"]`` names, if it does), ``task:INDEX[:N]``
(a ``TaskDone``, its raw output N characters longer, waited for alike), ``end:ID:STATUS[:TYPE:MESSAGE]`` (an
``EffectEnded`` with 3 prompt and 2 completion tokens), ``entry:ID:KIND:NAME`` (an ``EffectStarted`` with that id,
not waited for: crew code writing its own), ``flood:N:SIZE`` (``TaskDone`` for tasks 0 to N-1, each raw output SIZE
characters longer, none waited for: crew code that does not wait for its answers). Its trace: ``span:ID:PARENT:NAME``
(a ``SpanStarted`` now, with the attributes ``input["span_attributes"]`` holds, if it does), ``span-end:ID[:ERROR]``
(its ``SpanEnded``), ``span-flood:N`` (N spans begun and ended at once), ``span-hold:N`` (N spans begun, never
ended), ``trace`` (its ``Start.trace`` written to the file ``input["trace"]`` names). Another operation's
closed input carries the script in its ``inputs``.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from protocol import (
    CONTROL_FD,
    EVENT_FD,
    Building,
    Chunk,
    Completed,
    DumpStacks,
    EffectEnded,
    EffectStarted,
    Failed,
    Hello,
    Message,
    MessageReader,
    OverBudget,
    Reason,
    Recorded,
    SpanEnded,
    SpanStarted,
    Spent,
    Stacks,
    Start,
    Started,
    TaskDone,
    pack,
)

PR_SET_PDEATHSIG = 1
SLEEPER = [sys.executable, "-c", "import time; time.sleep(3600)"]


def send(message: Message) -> None:
    os.write(EVENT_FD, pack(message))


CONTROL = MessageReader()


def read_until(kind: type[Message]) -> Message:
    """The next message of ``kind`` on the control pipe (what comes before it is passed over)."""
    while True:
        data = os.read(CONTROL_FD, 65536)
        if not data:  # the supervisor closed our control pipe
            os._exit(0)
        for message in CONTROL.feed(data):
            if isinstance(message, kind):
                return message


def read_start() -> Start:
    start = read_until(Start)
    assert isinstance(start, Start)
    return start


def spawn_tree(pids: Path) -> None:
    """A child in our group and another in a session of its own, which a kill of our group misses."""
    child = subprocess.Popen(SLEEPER)
    escaped = subprocess.Popen(SLEEPER, start_new_session=True)
    pids.write_text(f"{child.pid} {escaped.pid}")


LEDGER = [0]  # the id of the last ledger entry sent
DIGEST = "0" * 64


def recorded(entry: int, start: Start) -> None:
    """Wait for ``Recorded(entry)``; say so in the acks file."""
    while True:
        answer = read_until(Recorded)
        if isinstance(answer, Recorded) and answer.id == entry:
            break
    if acks := start.input.get("acks"):
        with open(acks, "a") as file:
            file.write(f"recorded {entry}\n")


def task_done(index: int, longer: int) -> None:
    LEDGER[0] += 1
    output = {"description": f"task {index}", "agent": "scripted", "raw": f"done {index}" + "x" * longer}
    output |= {"pydantic": None, "json_dict": None, "output_format": "raw"}
    send(TaskDone(LEDGER[0], index, output, "fingerprint"))


def ledger(step: str, start: Start) -> None:
    what, _, rest = step.partition(":")
    fields = rest.split(":")
    if what == "effect":
        LEDGER[0] += 1
        send(EffectStarted(LEDGER[0], fields[0], fields[1], DIGEST))
        recorded(LEDGER[0], start)
    elif what == "task":
        task_done(int(fields[0]), int(fields[1] if len(fields) > 1 else 0))
        recorded(LEDGER[0], start)
    elif what == "flood":
        for index in range(int(fields[0])):
            task_done(index, int(fields[1]))
    elif what == "end":
        error = (fields[2], fields[3]) if len(fields) > 2 else ("", "")
        send(EffectEnded(int(fields[0]), fields[1], *error, 3, 2))
    elif what == "entry":
        send(EffectStarted(int(fields[0]), fields[1], fields[2], DIGEST))


SPANS = [0]  # the id of the last span span-flood or span-hold began


def spans(step: str, start: Start) -> None:
    what, _, rest = step.partition(":")
    fields = rest.split(":")
    if what == "span":
        send(SpanStarted(fields[0], fields[1], fields[2], time.time_ns(), start.input.get("span_attributes") or {}))
    elif what == "span-end":
        send(SpanEnded(fields[0], time.time_ns(), {}, fields[1] if len(fields) > 1 else ""))
    elif what in ("span-flood", "span-hold"):  # ids of their own: 1, 2, 3, ... in hex, past the scripts' letters
        for _ in range(int(fields[0])):
            SPANS[0] += 1
            id = f"{SPANS[0]:016x}"
            send(SpanStarted(id, "", "task", time.time_ns(), {}))
            if what == "span-flood":
                send(SpanEnded(id, time.time_ns(), {}, ""))
    else:
        Path(start.input["trace"]).write_text(start.trace)


def play(step: str, start: Start) -> None:
    if step.partition(":")[0] in ("effect", "task", "end", "entry", "flood"):
        ledger(step, start)
    elif step.partition(":")[0] in ("span", "span-end", "span-flood", "span-hold", "trace"):
        spans(step, start)
    elif step == "building":
        send(Building())
    elif step == "started":
        send(Started())
    elif step == "chunk":
        send(Chunk("text", {"content": "tick"}))
    elif step == "complete":
        send(Completed({"raw": "done", "tasks_output": [], "budget": [start.max_tokens, start.max_llm_calls]}))
    elif step == "fail":
        send(Failed("ValueError", Reason.OPERATION_FAILED, "the crew raised", False))
    elif step.startswith("forge:"):  # crew code writing a Failed of its own, with any reason
        send(Failed("MemoryError", step.removeprefix("forge:"), "forged by the crew", False))
    elif step == "spend":
        send(Spent("scripted-model", 10, 5, 1))
    elif step == "refund":
        send(Spent("scripted-model", -100, 0, 0))
    elif step.startswith("over-budget:"):
        send(OverBudget(step.removeprefix("over-budget:")))
    elif step == "await-dump":
        read_until(DumpStacks)
    elif step == "stacks":
        send(Stacks([{"name": "MainThread", "ident": 1, "stack": '  File "scripted_worker.py", line 1, in play\n'}]))
    elif step == "huge-stacks":
        stack = "x" * (1024 * 1024) + "innermost call\n"
        send(Stacks([{"name": "n" * 100_000, "ident": "not a number", "stack": stack}] * 3))
    elif step == "late-chunk":
        send(Chunk("text", {"content": "after the end"}))
    elif step == "hang":
        time.sleep(3600)
    elif step.startswith("exit:"):
        os._exit(int(step.removeprefix("exit:")))
    elif step == "close-events":
        os.close(EVENT_FD)
    elif step == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif step == "tree":
        spawn_tree(Path(start.input["pids"]))
    elif step == "shout":
        sys.stdout.write("x" * 65536)
        sys.stdout.flush()
    elif step == "linger":
        time.sleep(60)
    elif step == "await-go":
        go = Path(start.input["go"])
        deadline = time.monotonic() + 60
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.005)
    else:
        raise SystemExit(f"scripted_worker: unknown step {step!r}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["job"])
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--cwd")
    args = parser.parse_args()
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != args.parent_pid:  # the test died before we armed it
        os._exit(1)
    send(Hello(os.getpid()))
    start = read_start()
    for step in start.input.get("script") or (start.input.get("inputs") or {}).get("script", []):
        play(step, start)
    os._exit(0)


if __name__ == "__main__":
    main()
