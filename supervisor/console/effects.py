"""``crew-supervisor effects ID``: a job's effect ledger (``GET /jobs/{id}/effects``) as a table, each call's row, an
``uncertain`` one standing out: it had started when its job ended otherwise, and is what an operator reconciles."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from protocol import Effect, EffectStatus
from supervisor.console.durations import spoken
from supervisor.console.views import clock, dash, id_text, plain

DESCRIPTION = """\
A job's effect ledger: every tool call and LLM call its worker started, in
order, and how each ended: finished, failed (with its error), running (the
job runs), or uncertain (it had started when the job was cancelled, timed
out, killed or fenced at a restart: it may or may not have had its effect;
reconcile it before a new run). Tokens for LLM calls; how many of a run's
tasks completed."""
EFFECT_STYLES: dict[str, str] = {
    EffectStatus.FINISHED: "green",
    EffectStatus.FAILED: "red",
    EffectStatus.RUNNING: "cyan",
    EffectStatus.UNCERTAIN: "bold black on yellow",
}


def view(answer: dict[str, Any]) -> Group:
    """The table (id, kind, name, status, started, took, tokens or error), then what it comes to."""
    table = Table(box=None, header_style="bold", padding=(0, 1, 0, 0))
    for name in ("id", "kind", "name", "status", "started", "took"):
        table.add_column(name, no_wrap=name != "name", justify="right" if name == "id" else "left")
    table.add_column("tokens / error", overflow="fold")
    for entry in answer["effects"]:
        status = str(entry["status"])
        table.add_row(
            plain(entry["id"]),
            plain(entry["kind"]),
            plain(entry["name"]),
            plain(status, EFFECT_STYLES.get(status, "")),
            clock(entry["started_at"], short=True),
            took(entry),
            outcome(entry),
            style="bold" if status == EffectStatus.UNCERTAIN else None,
        )
    return Group(table, summary(answer))


def took(entry: dict[str, Any]) -> Text:
    if entry["ended_at"] is None or entry["started_at"] is None:
        return Text("-")
    return Text(spoken(entry["ended_at"] - entry["started_at"]))


def outcome(entry: dict[str, Any]) -> Text:
    """A failed call's error; else an LLM call's tokens (prompt + completion)."""
    if entry["status"] == EffectStatus.FAILED:
        return plain(": ".join(str(part) for part in (entry["error_type"], entry["error_message"]) if part), "red")
    if entry["kind"] == Effect.LLM:
        return plain(f"{entry['prompt_tokens']:,} + {entry['completion_tokens']:,}")
    return dash(None)


def summary(answer: dict[str, Any]) -> Text:
    """How many calls, by how they ended, and the tasks completed; the uncertain ones said apart."""
    statuses = [entry["status"] for entry in answer["effects"]]
    counted = ", ".join(f"{statuses.count(name)} {name}" for name in EFFECT_STYLES if name in statuses)
    calls = f"{len(statuses)} call{'' if len(statuses) == 1 else 's'}"
    line = Text.assemble(id_text(answer["action_id"]), f": {calls}{f' ({counted})' if counted else ''}")
    line.append(f", {answer['tasks_completed']} task(s) completed")
    if uncertain := statuses.count(EffectStatus.UNCERTAIN):
        line.append(
            f"\n{uncertain} uncertain: cut off when the job ended; each may or may not have had its effect",
            EFFECT_STYLES[EffectStatus.UNCERTAIN],
        )
    return line
