"""How the operator CLI shows jobs, workers and events to a person (rich renderables, one place).

Everything the server sends is shown through ``plain``/``visible``: ids, a crew's exception class name,
chunk text and cancel reasons are chosen by clients and crews, and must not reach the terminal as control
characters (an ESC or CSI starts an escape sequence: a window title, a cursor move) or as rich markup
(``[link=…]`` makes one too).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import orjson
from rich.table import Table
from rich.text import Text

from supervisor.escaping import visible

STATUS_STYLES = {"running": "cyan", "completed": "green", "failed": "red", "cancelled": "yellow"}
OUTPUT_PREVIEW = 2000  # characters of a completed job's raw output that ``show`` prints


def plain(value: Any, style: str = "", layout: bool = False) -> Text:
    """Server text for a rich renderable: visible, and never read as markup."""
    return Text(visible(value, layout), style=style)


def jobs_table(jobs: list[dict[str, Any]]) -> Table:
    table = Table("action id", "crew", "operation", "status", "events", "admitted", box=None, header_style="bold")
    for job in jobs:
        table.add_row(
            plain(job["action_id"]),
            plain(job["crew_id"]),
            plain(job["operation"]),
            status_text(job["status"]),
            plain(job["event_count"]),
            clock(job["admitted_at"]),
        )
    return table


def workers_table(workers: list[dict[str, Any]], now: float) -> Table:
    """Fits 80 columns: the id and pid never shrink; ``idle`` is the time since the last event.
    (``--json`` also has the process count and the wall-clock time of the last event.)"""
    table = Table(title=f"{len(workers)} live job(s)", box=None, header_style="bold", padding=(0, 1))
    longest = max((len(worker["action_id"]) for worker in workers), default=9)
    table.add_column("action id", no_wrap=True, min_width=min(longest, 40))
    for name in ("crew", "op", "phase"):
        table.add_column(name, overflow="ellipsis", no_wrap=True, min_width=4, max_width=12)
    table.add_column("pid", no_wrap=True, min_width=7)
    for name in ("rss", "cpu%", "cpu s", "age", "events", "idle"):
        table.add_column(name, justify="right", no_wrap=True)
    for worker in workers:
        last = worker["last_event_at"]
        table.add_row(
            plain(worker["action_id"]),
            plain(worker["crew_id"]),
            plain(worker["operation"]),
            plain(worker["phase"]),
            dash(worker["pid"]),
            megabytes(worker["rss_bytes"]),
            dash(worker["cpu_percent"]),
            dash(worker["cpu_seconds"]),
            f"{worker['age_seconds']:.0f}s",
            plain(worker["event_count"]),
            "-" if last is None else f"{max(now - last, 0):.1f}s",
        )
    return table


def job_panel(job: dict[str, Any]) -> Table:
    table = Table.grid(padding=(0, 2))
    for name in ("action_id", "crew_id", "operation", "event_count"):
        table.add_row(Text(name, style="bold"), plain(job[name]))
    table.add_row(Text("status", style="bold"), status_text(job["status"]))
    if job["status"] != "completed":  # a completed event's data is the output, shown below
        for name, value in (job.get("terminal") or {}).items():
            if name != "status" and not (name == "exit_status" and value == job.get("exit_status")):  # shown below
                table.add_row(plain(name, "dim"), plain(compact(value)))
    if job.get("exit_status") is not None:
        table.add_row(Text("exit_status", style="dim"), plain(job["exit_status"]))
    raw = (job.get("output") or {}).get("raw")
    if raw is not None:
        table.add_row(Text("output", style="bold"), plain(str(raw)[:OUTPUT_PREVIEW], layout=True))
    return table


def event_line(event: dict[str, Any]) -> Text:
    data = event["data"]
    summary = data.get("content") if event["event"] == "chunk" else compact(data)
    return Text.assemble(
        (f"{event['sequence']:>5} ", "dim"), (f"{visible(event['event']):<9} ", "bold"), visible(summary, layout=True)
    )


def terminal_line(event: dict[str, Any]) -> Text:
    data, name = event["data"], event["event"]
    if name == "completed":
        detail = f"{len(orjson.dumps(data))} bytes of output"
    elif name == "failed":
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
    return f"stop confirmed: {data.get('stop_confirmed')}, pid {data.get('pid')}, {data.get('signal')}"


def cancel_line(job: dict[str, Any]) -> Text:
    terminal = job.get("terminal") or {}
    if job["status"] != "cancelled":
        return Text.assemble(f"{visible(job['action_id'])} had already ended: ", status_text(job["status"]))
    return Text.assemble(
        f"{visible(job['action_id'])} ", status_text("cancelled"), f" ({visible(stop_proof(terminal))})"
    )


class ChunkText:
    """Chunks arrive a few words at a time: print whole lines, so the spinner below them stays intact."""

    def __init__(self) -> None:
        self._partial = ""

    def feed(self, event: dict[str, Any]) -> Iterator[str]:
        if event["event"] != "chunk":
            return
        *lines, self._partial = (self._partial + str(event["data"].get("content") or "")).split("\n")
        yield from (visible(line, layout=True) for line in lines)

    def rest(self) -> Iterator[str]:
        if self._partial:
            yield visible(self._partial, layout=True)
        self._partial = ""


def status_text(status: str) -> Text:
    return plain(status, STATUS_STYLES.get(status, ""))


def clock(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return datetime.datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M:%S")


def megabytes(size: int | None) -> str:
    return "-" if size is None else f"{size / (1024 * 1024):.0f}M"


def dash(value: Any) -> Text:
    return Text("-") if value is None else plain(value)


def compact(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()
