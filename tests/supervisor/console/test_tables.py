"""The CLI's tables fit the terminal with every id whole, so that it can be pasted into show or cancel."""

from __future__ import annotations

import io
import time
import uuid
from typing import Any

import pytest
from rich.console import Console

from supervisor.console import views

NOW = time.time()
LONG_ID = f"cli-{uuid.uuid4()}"  # the CLI's own ids: 40 characters


def job(action_id: str, crew: str, operation: str, status: str) -> dict[str, Any]:
    return {"action_id": action_id, "crew_id": crew, "operation": operation, "status": status,
            "event_count": 1234, "admitted_at": NOW - 3 * 86400}  # fmt: skip


def worker(action_id: str, crew: str, operation: str) -> dict[str, Any]:
    return {"action_id": action_id, "crew_id": crew, "operation": operation, "phase": "launching", "pid": 4194304,
            "rss_bytes": 160 << 20, "cpu_percent": 99.5, "cpu_seconds": 1234.5, "age_seconds": 3600,
            "event_count": 1234, "last_event_at": NOW - 3, "idle_seconds": 3.0, "tokens": 21111,
            "llm_calls": 61}  # fmt: skip


def rendered(table: Any, width: int, piped: bool = False) -> list[str]:
    """As a terminal of ``width`` shows it; ``piped``: as the CLI prints it to a pipe, lines never wrapped."""
    console = Console(width=width, record=True, file=io.StringIO(), soft_wrap=piped)
    console.print(table)
    return [line.rstrip() for line in console.export_text().splitlines()]


@pytest.mark.parametrize(
    ("width", "header"),
    [
        (80, ["action", "id", "crew", "status"]),
        (100, ["action", "id", "crew", "op", "status", "reason"]),
        (120, ["action", "id", "crew", "op", "status", "admitted", "took", "reason"]),
        (200, ["action", "id", "crew", "op", "status", "events", "admitted", "ended", "took", "reason"]),
    ],
)
def test_the_jobs_table_keeps_both_ids_whole_and_drops_the_least_needed_columns_first(
    width: int, header: list[str]
) -> None:
    jobs = [job(LONG_ID, "nightly-report-builder", "knowledge_query", "cancelled"), job("j", "demo", "run", "failed")]
    lines = rendered(views.jobs_table(jobs, width), width)
    assert all(len(line) <= width for line in lines), lines
    assert lines[0].split() == header
    assert lines[1].startswith(f"{LONG_ID} nightly-report-builder ") and "cancelled" in lines[1]
    assert lines[2].split()[:2] == ["j", "demo"]  # short values are never cut
    assert ("1234" in lines[1]) == (width >= 200)


@pytest.mark.parametrize("width", [80, 120, 200])
def test_the_jobs_table_says_why_a_job_failed_in_the_width_left(width: int) -> None:
    failed = {**job("cli-boom", "demo", "run", "failed"), "reason": "operation_failed", "error_type": "RuntimeError"}
    failed["message"] = "CrewAI operation failed " + "and more " * 30  # a long one is cut, never wrapped
    factory = {**job("cli-factory", "demo", "run", "failed"), "reason": "crew_factory_failed"}
    factory |= {"error_type": "ValueError", "message": "the crew factory raised ValueError"}
    stopped = {**job("j", "demo", "run", "cancelled"), "reason": "runaway crew"}
    shown = [failed, factory, stopped, job("k", "demo", "run", "completed")]
    lines = rendered(views.jobs_table(shown, width), width)
    assert all(len(line) <= width for line in lines) and len(lines) == 5, lines
    assert lines[0].split()[-1] == "reason" and "operation_failed: RuntimeErr" in lines[1]
    if width >= 200:
        assert "operation_failed: RuntimeError: CrewAI operation failed and more" in lines[1]
        assert "crew_factory_failed: the crew factory raised ValueError" in lines[2]  # the type is in the message
    assert lines[3].endswith("runaway crew") and lines[4].split()[3] == "completed"
    assert lines[1].endswith("…")  # the rest of the message is cut at the table's edge


def test_a_job_is_one_word_in_every_view_its_phase_while_it_runs() -> None:
    """As ``top`` shows it: a queued job is not listed as running."""
    queued = {**job("q", "demo", "run", "running"), "phase": "queued", "terminal": None, "exit_status": None}
    ended = {**job("e", "demo", "run", "failed"), "phase": None, "terminal": None, "exit_status": 1}
    listed = rendered(views.jobs_table([queued, ended], 80), 80)
    assert listed[1].split()[3] == "queued" and listed[2].split()[3] == "failed"
    shown = [line.split() for line in rendered(views.job_panel(queued), 80)]
    assert ["status", "queued"] in shown


def test_jobs_and_show_say_when_a_job_was_admitted_and_ended_and_how_long_it_took() -> None:
    """From its admission to its end, or so far while it runs (``--json`` keeps the API's Unix seconds)."""
    ended = {**job("e", "demo", "run", "completed"), "ended_at": NOW - 3 * 86400 + 65}
    running = {**job("r", "demo", "run", "running"), "admitted_at": NOW - 125}
    header, done, going = rendered(views.jobs_table([ended, running], 200, now=NOW), 200)
    assert header.split()[-4:] == ["admitted", "ended", "took", "reason"]
    assert done.split()[-3:] == [*views.clock(NOW - 3 * 86400 + 65, short=True).split(), "1m05s"], done
    admitted = views.clock(NOW - 125, short=True).split()  # the time alone, or the day too just after midnight
    assert going.split()[-2 - len(admitted) :] == [*admitted, "-", "2m05s…"], going
    shown = [line.split() for line in rendered(views.job_panel(ended, now=NOW), 80)]
    assert ["took", "1m05s"] in shown and ["ended", *views.clock(NOW - 3 * 86400 + 65).split()] in shown
    shown = [line.split() for line in rendered(views.job_panel(running, now=NOW), 80)]
    assert ["took", "2m05s", "so", "far"] in shown and ["ended", "-"] in shown


def test_show_names_what_a_job_left_running() -> None:
    process = {"pid": 4242, "command": "npx mcp-server\x1b[2J", "left": "own_session"}
    leftovers = {"descendants_killed": 1, "stop_confirmed": True, "processes": [process]}
    done = {**job("d", "demo", "run", "completed"), "terminal": None, "exit_status": 0, "leftovers": leftovers}
    lines = rendered(views.job_panel(done), 100)
    left = next(line for line in lines if line.startswith("left running"))
    assert "4242 (own_session, killed): npx mcp-server" in left and "\x1b" not in left  # a crew's text, made visible


@pytest.mark.parametrize(("width", "shown"), [(80, 5), (100, 8), (160, 10)])
def test_top_keeps_ids_and_drops_the_least_needed_columns_first(width: int, shown: int) -> None:
    lines = rendered(
        views.workers_table([worker(LONG_ID, "nightly-report-builder", "knowledge_query")], NOW, width), width
    )
    assert all(len(line) <= width for line in lines), lines
    header = lines[1].split()
    assert header[0] == "job" and len(header) - 1 == shown + header.count("s")  # "cpu s" is two words
    assert {"phase", "pid", "cpu%", "tokens", "idle"} <= set(header)  # what it spends stays in sight
    assert "21,111" in lines[2]
    assert lines[2].startswith(LONG_ID + " ") and "launching" in lines[2] and "4194304" in lines[2]
    assert lines[3].startswith("nightly-report-builder · knowledge_query")


@pytest.mark.parametrize("piped", [False, True])
@pytest.mark.parametrize("width", [30, 50, 80, 120])
def test_top_never_cuts_a_crew_id_longer_than_the_action_id(width: int, piped: bool) -> None:
    """The operation is shortened, and columns dropped, before the crew id is; one wider than the terminal allows
    folds onto the next line, whole. (At 30 columns the job column was squeezed out, ids and all.)"""
    crew = "a-crew-with-a-long-name-of-its-own"
    shown = [worker("t1", crew, "knowledge_query"), worker("t2", "c", "run")]
    lines = rendered(views.workers_table(shown, NOW, width), width, piped)
    assert all(len(line) <= width for line in lines), lines
    assert lines[2].startswith("t1 ") and "running" not in lines[2] and "launching" in lines[2]
    if width >= len(crew) + 10:
        (below,) = [line for line in lines if line.startswith(crew)]
        assert below.startswith(crew + " · " if width >= len(crew) + 15 else crew), below
    else:  # folded in the job's column, every character kept
        column = width - 10
        assert "".join(line[:column].rstrip() for line in lines[3:5]) == crew, lines
    assert any(line.startswith("c · run") for line in lines)


def test_a_bulk_cancel_counts_only_the_jobs_it_cancelled() -> None:
    """A job that was settling when the cancel came keeps its outcome: listed as ended, not counted as cancelled."""
    proof = {"stop_confirmed": True, "pid": 41, "signal": "SIGKILL", "descendants_killed": 0}
    stopped = {"action_id": "a", "status": "cancelled", "terminal": proof, "phase_before": "running"}
    ended = {"action_id": "b", "status": "completed", "terminal": {}, "phase_before": "running"}
    lines = rendered(views.cancelled({"dry_run": False, "more": 0, "jobs": [stopped, ended]}), 120)
    assert lines[0] == "cancelled 1 job" and "a cancelled (stop confirmed: True, pid 41, SIGKILL" in lines[1]
    assert lines[2] == "b had already ended: completed"
    listed = rendered(views.cancelled({"dry_run": True, "more": 3, "jobs": [stopped, ended]}), 120)
    assert listed[0] == "would cancel 2 jobs" and "3 more matched" in listed[-1]


@pytest.mark.parametrize("width", [30, 80])
def test_top_says_what_each_queued_job_waits_for(width: int) -> None:
    """A slot of the total, or its crew's own (CREW_MAX_CONCURRENCY): a line for each under the table."""
    running = worker("r1", "research", "run")
    for_crew = {
        **worker("q1", "research", "run"),
        "phase": "queued",
        "waiting": {"on": "crew", "running": 1, "limit": 1},
    }
    for_slot = {**worker("q2", "writer", "run"), "phase": "queued", "waiting": {"on": "slot", "running": 4, "limit": 4}}
    lines = rendered(views.top_view([running, for_crew, for_slot], NOW, width), width, piped=True)
    assert lines[-2:] == ["q1 waits for crew research (1/1 running)", "q2 waits for a slot (4/4 running)"]
    assert rendered(views.top_view([running], NOW, width), width) == rendered(
        views.workers_table([running], NOW, width), width
    )


def test_show_gives_a_traced_jobs_trace_and_its_page_whole() -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    url = (
        f"https://grafana.example/explore?orgId=1&left=%7B%22datasource%22:%22tempo%22,%22query%22:%22{trace_id}%22%7D"
    )
    traced = {**job("t", "demo", "run", "completed"), "trace_id": trace_id, "trace_url": url}
    lines = rendered(views.job_panel(traced), 80)
    assert ["trace", trace_id] in [line.split() for line in lines]
    at = next(i for i, line in enumerate(lines) if line.startswith("trace url"))
    folded = "".join(line[len("trace url") :].strip() for line in lines[at : at + 3])
    assert folded.startswith(url)  # folded at the width, never cut: it pastes back whole
    untraced = [line.split()[0] for line in rendered(views.job_panel(job("u", "demo", "run", "completed")), 80)]
    assert "trace" not in untraced  # a job not traced (or a server older than traces) says nothing of it
