"""How the operator CLI shows jobs, workers and events to a person (rich renderables, one place).

Everything the server sends is shown through ``plain``/``visible``: ids, a crew's exception class name,
chunk text and cancel reasons are chosen by clients and crews, and must not reach the terminal as control
characters (an ESC or CSI starts an escape sequence: a window title, a cursor move) or as rich markup
(``[link=…]`` makes one too).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from supervisor.console.durations import spoken
from supervisor.enums import EventName, Phase, Status, WaitingFor
from supervisor.escaping import ident, visible
from supervisor.tracebacks import last_traceback

STATUS_STYLES: dict[str, str] = {
    **dict.fromkeys((Phase.QUEUED, Phase.LAUNCHING, Phase.SETTLING), "dim cyan"),
    Status.RUNNING: "cyan",  # the phase's word too
    Status.COMPLETED: "green",
    Status.FAILED: "red",
    Status.CANCELLED: "yellow",
}
OUTPUT_PREVIEW = 2000  # characters of a completed job's raw output that ``show`` prints


def plain(value: Any, style: str = "", layout: bool = False) -> Text:
    """Server text for a rich renderable: visible, and never read as markup."""
    return Text(visible(value, layout), style=style)


def id_text(value: Any, style: str = "") -> Text:
    """An action or crew id: no look-alike passes for another (``escaping.ident``), and it reads back as typed."""
    return Text(ident(value), style=style, overflow="fold")  # wider than the terminal: folded, never cut


def jobs_table(jobs: list[dict[str, Any]], width: int = 80, now: float | None = None) -> Table:
    """Fits ``width`` columns with the ids whole, so that an action id can be pasted into ``show`` and a crew id
    into ``--crew``: the others share what they leave (why a job failed or was cancelled, cut with an ellipsis),
    and where that is too little, ``JOBS_DROPPED_FIRST`` go first. Ids wider than the terminal fold, never cut."""
    now = time.time() if now is None else now
    table = Table(box=None, header_style="bold", padding=(0, 1, 0, 0))
    ids = {"action id": "action_id", "crew": "crew_id"}
    sizes = {name: max((len(ident(job[key])) for job in jobs), default=len(name)) for name, key in ids.items()}
    sizes |= {"op": max((len(str(job["operation"])) for job in jobs), default=2)}
    sizes |= {"status": 9, "events": 6, "admitted": 11, "ended": 11, "took": 7}  # "cancelled", "11-29 03:43", "59m59s…"
    sizes |= {"reason": max(8, min(REASON_ROOM, max((len(why(job) or "") for job in jobs), default=0)))}
    for name in JOBS_DROPPED_FIRST:
        if sum(size + 1 for size in sizes.values()) <= width:
            break
        del sizes[name]
    left = width - sum(size + 1 for size in sizes.values())
    for name, size in sizes.items():
        if name in ids:  # its content's width, or folded where the terminal is narrower still
            table.add_column(name, overflow="fold")
        elif name == "reason":
            table.add_column(name, overflow="ellipsis", no_wrap=True, max_width=size + max(left, 0))
        else:
            table.add_column(name, no_wrap=True, min_width=size, justify="right" if name == "events" else "left")
    for job in jobs:
        cells: dict[str, RenderableType] = {
            "action id": id_text(job["action_id"]),
            "crew": id_text(job["crew_id"]),
            "op": plain(job["operation"]),
            "status": status_text(state(job)),
            "events": plain(job["event_count"]),
            "admitted": clock(job["admitted_at"], short=True),
            "ended": clock(job.get("ended_at"), short=True),
            "took": took(job, now),
            "reason": plain(why(job) or "", "dim"),
        }
        table.add_row(*(cells[name] for name in sizes))
    return table


# Where the width runs out; ids and status always show. Columns go before a job's reason has this much room.
JOBS_DROPPED_FIRST = ("events", "ended", "admitted", "took", "reason", "op")
REASON_ROOM = 30  # "operation_failed: RuntimeError"


def took(job: dict[str, Any], now: float, so_far: str = "…") -> Text:
    """From its admission to its end (its queue wait too); a running job's so far, dim and marked ``so_far``."""
    admitted, ended = job.get("admitted_at"), job.get("ended_at")
    if admitted is None:
        return Text("-")
    if ended is not None:
        return Text(spoken(ended - admitted))
    if job["status"] == Status.RUNNING:
        return Text(spoken(now - admitted) + so_far, "dim")
    return Text("-")  # it ended before the journal kept when


def why(job: dict[str, Any]) -> str | None:
    """Why a job failed, in short: its reason, its error type where that says more, its message (the API's list
    gives a failed job's); a cancelled job's reason, the canceller's words."""
    if job["status"] == Status.CANCELLED:
        return job.get("reason")
    if job["status"] != Status.FAILED:
        return None
    reason, error_type, message = (str(job.get(key) or "") for key in ("reason", "error_type", "message"))
    if error_type == reason or error_type in message:  # "the crew factory raised ValueError" says it already
        error_type = ""
    return ": ".join(part for part in (reason, error_type, message) if part) or None


# ``top``'s columns after the job's: name, width (its longest value or header), and the cell. The job's column
# holds the id whole (it is what ``cancel`` takes) over its crew and operation.
WORKER_COLUMNS: tuple[tuple[str, int, Callable[[dict[str, Any], float], Any]], ...] = (
    ("phase", 9, lambda w, now: plain(w["phase"])),  # "launching"
    ("pid", 7, lambda w, now: dash(w["pid"])),
    ("rss", 5, lambda w, now: megabytes(w["rss_bytes"])),
    ("cpu%", 5, lambda w, now: dash(w["cpu_percent"])),
    ("tokens", 7, lambda w, now: f"{w['tokens']:,}"),  # LLM tokens spent so far, and calls made
    ("calls", 5, lambda w, now: plain(w["llm_calls"])),
    ("cpu s", 7, lambda w, now: dash(w["cpu_seconds"])),
    ("age", 6, lambda w, now: f"{w['age_seconds']:.0f}s"),
    ("events", 6, lambda w, now: plain(w["event_count"])),
    ("idle", 6, lambda w, now: "-" if w["idle_seconds"] is None else f"{w['idle_seconds']:.1f}s"),  # its clock
)
# Where the width runs out, in this order; then the rest but the phase, so that the ids keep their column.
DROPPED_FIRST = ("cpu s", "age", "events", "calls", "rss")
DROPPED_NEXT = ("tokens", "idle", "cpu%", "pid")


def workers_table(workers: list[dict[str, Any]], now: float, width: int = 80) -> Table:
    """Fits ``width`` columns: the ids whole (an id wider than the terminal allows folds), then as many of the
    columns as fit, dropping ``DROPPED_FIRST`` first, then ``DROPPED_NEXT``; ``idle`` is the time since the last
    event. (``--json`` has every field, and the process count.)"""
    table = Table(title=f"{len(workers)} live job(s)", box=None, header_style="bold", padding=(0, 1, 0, 0))
    ids = max((max(len(ident(worker[key])) for key in ("action_id", "crew_id")) for worker in workers), default=9)
    crew_and_op = max((len(ident(worker["crew_id"])) + 3 + len(worker["operation"]) for worker in workers), default=9)
    # Room for the operation up to 48, for the ids whatever it takes: less than the phase column (10) leaves.
    id_width = max(min(max(ids, crew_and_op), 48, width - 10), min(ids, width - 10), 9)
    columns = list(WORKER_COLUMNS)
    for name in DROPPED_FIRST + DROPPED_NEXT:
        if id_width + sum(size + 1 for _, size, _ in columns) < width:
            break
        columns = [column for column in columns if column[0] != name]
    # An id longer than the column folds onto another line: never cut, it is what ``cancel`` takes.
    table.add_column("job", no_wrap=False, overflow="fold", min_width=id_width, max_width=id_width)
    for name, size, _ in columns:
        table.add_column(name, justify="left" if name == "phase" else "right", no_wrap=True, min_width=size)
    for worker in workers:
        table.add_row(job_cell(worker, id_width), *(cell(worker, now) for _, _, cell in columns))
    return table


def job_cell(worker: dict[str, Any], width: int) -> Text:
    """The action id over the crew id, both whole, then the operation in what the crew leaves of ``width``
    (shortened, or left out): the operation is the one ``--json`` and ``show`` give again."""
    crew = ident(worker["crew_id"])
    room = width - len(crew) - 3  # " · "
    operation = visible(worker["operation"])
    shown = operation if len(operation) <= room else operation[: room - 1] + "…" if room >= 2 else ""
    what = Text.assemble(id_text(crew), f" · {shown}" if shown else "", style="dim")
    return Text.assemble(id_text(worker["action_id"]), "\n", what)


def top_view(workers: list[dict[str, Any]], now: float, width: int = 80) -> RenderableType:
    """``top``'s frame: the workers' table, then a line for each queued job saying what it waits for (whole ids: a
    line of its own has the room the table's columns lack)."""
    waits = [
        Text.assemble(id_text(worker["action_id"]), f" {said}", style="yellow")
        for worker in workers
        if (said := waiting_text(worker)) is not None
    ]
    table = workers_table(workers, now, width)
    return Group(table, *waits) if waits else table


def waiting_text(worker: dict[str, Any]) -> str | None:
    """What a queued job waits for (``/workers``' ``waiting``): a slot of ``MAX_CONCURRENCY``, or its crew's own,
    with how many of those run; None for a job that does not wait."""
    waiting = worker.get("waiting")  # not sent by a server older than CREW_MAX_CONCURRENCY
    if not waiting:
        return None
    running = f"({waiting['running']}/{waiting['limit']} running)"
    if waiting["on"] == WaitingFor.CREW:
        return f"waits for crew {ident(worker['crew_id'])} {running}"
    return f"waits for a slot {running}"


def job_panel(job: dict[str, Any], now: float | None = None) -> Table:
    table = Table.grid(padding=(0, 2))
    for name in ("action_id", "crew_id", "operation", "event_count"):
        table.add_row(Text(name, style="bold"), id_text(job[name]) if name.endswith("_id") else plain(job[name]))
    table.add_row(Text("status", style="bold"), status_text(state(job)))
    table.add_row(Text("admitted", style="bold"), clock(job.get("admitted_at")))
    table.add_row(Text("ended", style="bold"), clock(job.get("ended_at")))
    table.add_row(Text("took", style="bold"), took(job, time.time() if now is None else now, so_far=" so far"))
    for name, said in (("resumed_from", "resumes"), ("resumed_by", "resumed by")):  # absent from an older server
        if job.get(name) is not None:
            table.add_row(Text(said, style="bold"), id_text(job[name]))
    for name, said in (("trace_id", "trace"), ("trace_url", "trace url")):  # a traced job's; its page in a trace UI
        if job.get(name) is not None:
            table.add_row(Text(said, style="bold"), Text(visible(job[name]), overflow="fold"))  # whole, to paste
    if job["status"] != Status.COMPLETED:  # a completed event's data is the output, shown below
        for name, value in (job.get("terminal") or {}).items():
            if name != "status" and not (name == "exit_status" and value == job.get("exit_status")):  # shown below
                table.add_row(plain(name, "dim"), plain(compact(value)))
    if job.get("exit_status") is not None:
        table.add_row(Text("exit_status", style="dim"), plain(job["exit_status"]))
    for process in (job.get("leftovers") or {}).get("processes", []):  # what the worker left running: killed
        left = f"{process.get('pid')} ({process.get('left')}, killed): {process.get('command')}"
        table.add_row(Text("left running", style="dim"), plain(left))
    raw = (job.get("output") or {}).get("raw")
    if raw is not None:
        table.add_row(Text("output", style="bold"), plain(str(raw)[:OUTPUT_PREVIEW], layout=True))
    return table


def crews_view(served: dict[str, Any]) -> Group:
    """What ``crews`` prints: each crew, with its own LLM budget per job where its registry entry gives one, under
    the supervisor's (the lower of the two applies; ``-``: none), and how many of its jobs may run at once
    (``CREW_MAX_CONCURRENCY``; ``-``: only ``MAX_CONCURRENCY``), then the operations it takes."""
    budget, bounds = served["llm_budget"], served["max_concurrency"]
    table = Table(box=None, header_style="bold", padding=(0, 2, 0, 0))
    table.add_column("crew", overflow="fold")
    table.add_column("own tokens/job", justify="right", no_wrap=True)
    table.add_column("own LLM calls/job", justify="right", no_wrap=True)
    table.add_column("jobs at once", justify="right", no_wrap=True)
    for crew in served["crews"]:
        own = budget["crews"].get(crew, {})
        own_limits = (count(own.get(name)) for name in ("max_tokens", "max_llm_calls"))
        table.add_row(id_text(crew), *own_limits, count(bounds.get(crew)))
    limits = f"{count(budget['max_tokens'])} tokens, {count(budget['max_llm_calls'])} LLM calls"
    return Group(
        Text(f"{len(served['crews'])} crew(s) served ({visible(served['status'])}); per job: {limits}", "bold"),
        table,
        Text.assemble(("operations: ", "bold"), ", ".join(visible(operation) for operation in served["operations"])),
    )


def count(limit: Any) -> str:
    """A limit as a person reads it: ``100,000``, or ``-`` for none (0)."""
    return f"{limit:,}" if isinstance(limit, int) and limit else "-"


def event_line(event: dict[str, Any]) -> Text:
    data = event["data"]
    summary = data.get("content") if event["event"] == EventName.CHUNK else compact(data)
    return Text.assemble(
        (f"{event['sequence']:>5} ", "dim"), (f"{visible(event['event']):<9} ", "bold"), visible(summary, layout=True)
    )


def terminal_line(event: dict[str, Any]) -> Text:
    data, name = event["data"], event["event"]
    if name == Status.COMPLETED:
        detail = f"{len(orjson.dumps(data))} bytes of output"
    elif name == Status.FAILED:
        reason = f" (reason {data['reason']})" if data.get("reason") else ""
        detail = f"{data.get('error_type')}: {data.get('message')}{reason}"
    else:
        detail = f"{data.get('reason')} ({stop_proof(data)})"
    return Text.assemble(status_text(name), f" after {event['sequence'] + 1} events · {visible(detail)}")


def answer_text(output: dict[str, Any]) -> str:
    """What a job answered: its structured output when it has one, else its raw text."""
    for field in ("json_dict", "pydantic"):
        if output.get(field) is not None:
            return compact(output[field])
    if output.get("raw") is not None:
        return str(output["raw"])
    return compact(output)  # batch_run, train, test, knowledge_query, memory_reset: the output is its own shape


def stop_proof(data: dict[str, Any]) -> str:
    """A stop's evidence in words; a job stopped before it had a worker has none to show."""
    if data.get("pid") is None:
        return "stopped before it had a worker"
    killed = data.get("descendants_killed")
    also = f", {killed} descendant{'' if killed == 1 else 's'} killed" if isinstance(killed, int) else ""
    return f"stop confirmed: {data.get('stop_confirmed')}, pid {data.get('pid')}, {data.get('signal')}{also}"


STDERR_LINES = 10  # of a failed job's stderr that ``run`` and ``show`` print, or from its last traceback if longer


def stderr_end(text: str) -> Text:
    """The end of a failed job's stderr: where the crew's own error says why (a missing key, a refused call), and
    where its worker wrote the crew's exception whole."""
    end = "\n".join(text.rstrip("\n").split("\n")[-STDERR_LINES:])
    raised = last_traceback(text)
    if raised is not None and len(raised) > len(end):
        end = raised
    return Text.assemble(("its stderr ends with:\n", "bold"), visible(end, layout=True))


def stacks_view(stacks: dict[str, Any]) -> Text:
    """Each thread's calls under its name, innermost last, as faulthandler writes them."""
    when = clock(stacks["taken_at"])
    before = f", just before its {stacks['before']} kill" if stacks.get("before") else ""
    parts: list[Text | str] = [
        Text.assemble(id_text(stacks["action_id"]), f" ({visible(stacks['status'])}): stacks taken at {when}{before}")
    ]
    for thread in stacks["threads"]:
        parts += ["\n\n", plain(f"Thread {thread['name']} ({thread['ident']}):", "bold"), "\n"]
        parts.append(plain(str(thread["stack"]).rstrip("\n"), layout=True))
    return Text.assemble(*parts)


def cancel_line(job: dict[str, Any]) -> Text:
    terminal = job.get("terminal") or {}
    if job["status"] != Status.CANCELLED:
        return Text.assemble(id_text(job["action_id"]), " had already ended: ", status_text(job["status"]))
    return Text.assemble(
        id_text(job["action_id"]), " ", status_text(Status.CANCELLED), f" ({visible(stop_proof(terminal))})"
    )


def cancelled(answer: dict[str, Any]) -> Text:
    """A bulk cancel: each job it stopped with its proof, or (``dry_run``) each it would stop."""
    jobs, lines = answer["jobs"], []
    for job in jobs:
        if answer["dry_run"]:
            lines.append(Text.assemble("  ", id_text(job["action_id"]), f" ({visible(job['phase_before'])})"))
        else:
            lines.append(cancel_line(job))
    # A job settling as the cancel came kept its outcome (its line says "had already ended"): not counted.
    count = len(jobs) if answer["dry_run"] else sum(job["status"] == Status.CANCELLED for job in jobs)
    verb = "would cancel" if answer["dry_run"] else "cancelled"
    head = Text(f"{verb} {count} job{'' if count == 1 else 's'}", "bold")
    more = [Text(f"{answer['more']} more matched: run it again to cancel them", "yellow")] if answer["more"] else []
    return Text("\n").join([head, *lines, *more])


class ChunkText:
    """Chunks arrive a few words at a time: print whole lines, so the spinner below them stays intact."""

    def __init__(self) -> None:
        self._partial = ""

    def feed(self, event: dict[str, Any]) -> Iterator[str]:
        if event["event"] != EventName.CHUNK:
            return
        *lines, self._partial = (self._partial + str(event["data"].get("content") or "")).split("\n")
        yield from (visible(line, layout=True) for line in lines)

    def rest(self) -> Iterator[str]:
        if self._partial:
            yield visible(self._partial, layout=True)
        self._partial = ""


def state(job: dict[str, Any]) -> str:
    """The one word for a job: its phase while it runs (as ``top`` shows it), else its status."""
    return str(job.get("phase") or job["status"])


def status_text(status: str) -> Text:
    return plain(status, STATUS_STYLES.get(status, ""))


def clock(seconds: float | None, short: bool = False) -> str:
    """Local time; ``short``: the time alone today, else the day and the minute (a table's column)."""
    if seconds is None:
        return "-"
    moment = datetime.datetime.fromtimestamp(seconds)
    if not short:
        return moment.strftime("%Y-%m-%d %H:%M:%S")
    return moment.strftime("%H:%M:%S" if moment.date() == datetime.date.today() else "%m-%d %H:%M")


def megabytes(size: int | None) -> str:
    return "-" if size is None else f"{size / (1024 * 1024):.0f}M"


def dash(value: Any) -> Text:
    return Text("-") if value is None else plain(value)


def compact(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()
