"""A crew's secrets are masked in everything stored or shown: a crew that writes its keys (one from its crew's file
under a name like no secret's, one named like a secret in the supervisor's environment) streamed a few characters a
chunk, in its final answer and a dict's key of its output, on stdout and stderr, and in the exception it raises:
neither key, nor any part of one of 6 characters or more, is in the journal's files or the job's chunk events (JSON
and SSE); neither key is in the API's other answers, the console, ``crew-supervisor show`` and ``events``, or the
supervisor's log; where they were, each says ``[redacted]``."""

from __future__ import annotations

import secrets
from pathlib import Path

import orjson

from supervisor.redaction import MIN_FRAGMENT_CHARS, REDACTED
from tests.conftest import sse_events, start_body
from tests.crews.base import SPILLED
from tests.supervisor.console.test_cli import cli
from tests.system.security.test_crew_env import crew_env_dir, serve

SSE = {"Accept": "text/event-stream"}


def test_a_crew_s_keys_are_masked_in_events_outputs_tails_show_the_console_and_the_log(tmp_path: Path) -> None:
    # Not hex: a part of 6 hex digits could be in the journal by chance (its ids are hex).
    from_file, named = "acme-" + secrets.token_urlsafe(24), "pw-" + secrets.token_urlsafe(24)
    directory = crew_env_dir(tmp_path, {"spiller": f"{SPILLED[0]}={from_file}\n"})
    server = serve(tmp_path, directory, secrets.token_urlsafe(16), **{SPILLED[1]: named})
    said: list[str] = []
    sent: list[str] = []  # each chunk event's text, as SSE sent it
    with server.client() as client:
        answered, raised = (
            client.post(
                "/jobs", json=start_body("spiller", action, input={"mode": mode}), headers={"Idempotency-Key": action}
            )
            for action, mode in (("spill-1", "answer"), ("spill-2", "raise"))
        )
        assert (answered.status_code, raised.status_code) == (200, 502), (answered.text, raised.text)
        said += [answered.text, raised.text, client.get("/jobs").text, client.get("/console").text]
        for action in ("spill-1", "spill-2"):
            said += [client.get(f"/jobs/{action}{path}").text for path in ("", "/events", "/output")]
            with client.stream("GET", f"/jobs/{action}/events", headers=SSE) as stream:
                streamed = list(sse_events(stream))
            said.append(orjson.dumps(streamed).decode())
            sent += [event["data"]["content"] for event in streamed if event["event"] == "chunk"]
        events = client.get("/jobs/spill-1/events").json()["events"]
        failed = client.get("/jobs/spill-2").json()
        tails = client.get("/jobs/spill-2/output").json()
    shown = [cli(server, *args) for args in (("show", "spill-1"), ("show", "spill-2", "--json"), ("events", "spill-1"))]
    assert all(result.returncode in (0, 3) for result in shown), [result.stderr for result in shown]
    said += [result.stdout.replace("\n", "") for result in shown]  # rich folds long lines
    journal = sorted((tmp_path / "state").glob("journal.db*"))  # the database and its -wal, as they are on disk
    log = server.log.read_text()

    chunks = [event["data"]["content"] for event in events if event["event"] == "chunk"]
    assert "".join(chunks) == "".join(sent) == f"key {REDACTED} key {REDACTED} "  # each sent whole, so masked
    for key in (from_file, named):
        assert not [text for text in said if key in text]
        assert journal and not [path.name for path in journal if key.encode() in path.read_bytes()]
        assert key not in log
        parts = {key[at : at + MIN_FRAGMENT_CHARS] for at in range(len(key) - MIN_FRAGMENT_CHARS + 1)}
        assert not [(part, text) for part in parts for text in chunks + sent if part in text]
        assert not [(part, path.name) for part in parts for path in journal if part.encode() in path.read_bytes()]
    output = answered.json()
    assert output["raw"] == f"the keys are {REDACTED} and {REDACTED}"
    assert output["json_dict"] == {REDACTED: REDACTED}  # a key of a dict too
    assert events[-1] == {"event": "completed", "sequence": len(events) - 1, "data": output}
    assert failed["llm_spent"]["model"] == f"spiller-{REDACTED}"
    assert failed["terminal"]["error_type"] == f"Refused{REDACTED}"  # its message is the generic one; stderr says it
    assert f"Refused{REDACTED}: the provider refused {REDACTED} and {REDACTED}" in tails["stderr"]["text"]
    assert f"spilling {REDACTED} {REDACTED}" in tails["stdout"]["text"]
    assert REDACTED in shown[0].stdout
    logged = [orjson.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert {"event": "job finished", "action_id": "spill-2", "error_type": f"Refused{REDACTED}"}.items() <= next(
        line for line in logged if line["event"] == "job finished" and line.get("action_id") == "spill-2"
    ).items()
    assert REDACTED in next(line["traceback"] for line in logged if line["event"] == "the crew raised")
