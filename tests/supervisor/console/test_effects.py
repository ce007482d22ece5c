"""``crew-supervisor effects ID``: a job's effect ledger as a table, its uncertain calls standing out, crew-chosen
text written out; ``--json`` the API's answer. Against a real supervisor running the ``effects`` crew."""

from __future__ import annotations

import datetime
import io
from typing import Any

import orjson
from rich.console import Console

from supervisor.console import effects
from tests.conftest import Server, start_body
from tests.supervisor.console.test_cli import cli


def noon() -> float:
    """Today's noon, read as the test runs: a start today shows as its time alone (one word of the row). A time
    taken at import was yesterday's, two words (its day, its time), for a run that crossed midnight."""
    return datetime.datetime.combine(datetime.date.today(), datetime.time(12)).timestamp()


def entry(id: int, kind: str, status: str, **more: Any) -> dict[str, Any]:
    now = noon()
    ended = None if status in ("running", "uncertain") else now - 1
    return {"id": id, "kind": kind, "name": "record_effect" if kind == "tool" else "gpt-4o", "status": status,
            "started_at": now - 3, "ended_at": ended, "args_digest": "0" * 64, "error_type": None,
            "error_message": None, "prompt_tokens": 0, "completion_tokens": 0, **more}  # fmt: skip


HOSTILE_ERROR = "no \x1b[31mred\x1b[0m [bold]here[/bold]"


def ledger() -> dict[str, Any]:
    return {
        "action_id": "job-1",
        "tasks_completed": 1,
        "effects": [
            entry(1, "llm", "finished", prompt_tokens=1200, completion_tokens=34),
            entry(2, "tool", "failed", error_type="RuntimeError", error_message=HOSTILE_ERROR),
            entry(3, "tool", "uncertain"),
        ],
    }


def rendered(answer: dict[str, Any], terminal: bool = False) -> str:
    out = io.StringIO()
    Console(file=out, width=140, force_terminal=terminal, color_system="standard" if terminal else None).print(
        effects.view(answer)
    )
    return out.getvalue()


def test_each_call_is_a_row_with_how_it_ended_and_the_uncertain_ones_stand_out() -> None:
    text = rendered(ledger())
    lines = text.splitlines()
    assert lines[0].split() == ["id", "kind", "name", "status", "started", "took", "tokens", "/", "error"]
    assert lines[1].split()[:4] == ["1", "llm", "gpt-4o", "finished"] and "1,200 + 34" in lines[1]
    assert lines[2].split()[:4] == ["2", "tool", "record_effect", "failed"]
    assert "RuntimeError: no \\x1b[31mred\\x1b[0m [bold]here[/bold]" in lines[2]  # written out, never markup
    assert lines[3].split()[:4] == ["3", "tool", "record_effect", "uncertain"] and lines[3].split()[5] == "-"
    assert "job-1: 3 calls (1 finished, 1 failed, 1 uncertain), 1 task(s) completed" in text
    assert "1 uncertain: cut off when the job ended; each may or may not have had its effect" in text
    coloured = rendered(ledger(), terminal=True)
    assert "\x1b[1;30;43muncertain" in coloured  # black on yellow, bold: it stands out
    assert "\x1b[31mred" not in coloured  # the error's own escape never reaches the terminal


def test_a_ledger_of_no_calls_says_so() -> None:
    text = rendered({"action_id": "quiet", "tasks_completed": 0, "effects": []})
    assert "quiet: 0 calls, 0 task(s) completed" in text and "uncertain" not in text


def test_the_command_shows_a_real_jobs_ledger_and_its_json_is_the_apis(server: Server) -> None:
    with server.client() as client:
        body = start_body("effects", "cli-effects", input={"fail_in_step": 2})
        assert client.post("/jobs", json=body, headers={"Idempotency-Key": "k"}).status_code == 200
        api = client.get("/jobs/cli-effects/effects").json()
    shown = cli(server, "effects", "cli-effects")
    assert shown.returncode == 0, shown.stderr
    rows = [line.split() for line in shown.stdout.splitlines()]
    assert [row[1:4] for row in rows if row[1:2] == ["tool"]][:2] == [
        ["tool", "record_effect", "finished"],
        ["tool", "record_effect", "failed"],
    ], shown.stdout
    assert "RuntimeError: tool failed" in shown.stdout and "4 task(s) completed" in shown.stdout
    as_json = cli(server, "effects", "cli-effects", "--json")
    assert as_json.returncode == 0 and orjson.loads(as_json.stdout) == api
    missing = cli(server, "effects", "nobody")
    assert missing.returncode == 1 and "404" in missing.stderr
