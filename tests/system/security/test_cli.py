"""The operator CLI against hostile text from the server: no control character reaches the terminal, no id passes
for another, ids are percent-encoded in paths, and a stream it cannot read is one line on stderr, never a traceback."""

from __future__ import annotations

import contextlib
import http.server
import re
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from supervisor.console import sse
from tests.conftest import Server, start_body
from tests.crews.hostile_text import ESCAPING_CLASS_NAME
from tests.supervisor.console.test_cli import cli

KEY = {"Idempotency-Key": "k"}
TITLE_AND_OVERWRITE = "\x1b]0;PWNED\x07\x1b[2K\x1b[1A"  # sets the window title, erases the line above
# Any C0 control but tab and newline (which the CLI's own layout uses), DEL, and C1.
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert not CONTROL.search(result.stdout), repr(result.stdout)
    assert not CONTROL.search(result.stderr), repr(result.stderr)
    return result


def unwrapped(result: subprocess.CompletedProcess[str]) -> str:
    """Rich folds long lines at the terminal's width (80 here); the texts looked for have no spaces."""
    return result.stdout.replace("\n", "")


def test_an_exception_class_name_is_shown_escaped(server: Server, tmp_path: Path) -> None:
    (tmp_path / "input.json").write_text("{}")
    ran = clean(cli(server, "run", "escaping-error", "--input", str(tmp_path / "input.json"), "--action-id", "evil-1"))
    assert ran.returncode == 3, ran.stderr
    for result in (ran, clean(cli(server, "show", "evil-1"))):
        assert "Evil\\x1b]0;PWNED\\x07\\x1b[2K\\x1b[1A\\u009b2J" in unwrapped(result), result.stdout
    listed = clean(cli(server, "events", "evil-1"))  # each event's data as JSON: C0 as JSON escapes it
    assert "Evil\\u001b]0;PWNED\\u0007\\u001b[2K\\u001b[1A\\u009b2J" in unwrapped(listed), listed.stdout
    as_json = clean(cli(server, "show", "evil-1", "--json"))  # JSON escapes C0; C1 is escaped too
    assert orjson.loads(as_json.stdout)["terminal"]["error_type"] == ESCAPING_CLASS_NAME


def test_chunk_text_is_shown_escaped_and_line_separators_do_not_break_following(server: Server, tmp_path: Path) -> None:
    (tmp_path / "input.json").write_bytes(orjson.dumps({"text": f"{TITLE_AND_OVERWRITE}hello\u2028world"}))
    ran = clean(cli(server, "run", "echo", "--input", str(tmp_path / "input.json"), "--action-id", "echo-cli"))
    followed = clean(cli(server, "events", "echo-cli", "--follow"))
    for result in (ran, followed):
        assert result.returncode == 0, result.stderr
        assert "\\x1b]0;PWNED\\x07\\x1b[2K\\x1b[1Ahello\\u2028world" in unwrapped(result), result.stdout


def test_a_cancel_reason_and_an_id_are_shown_escaped(server: Server) -> None:
    action, reason = "c1\u009b2J-job", "\x1b[2K\u009b1Astop"
    with server.client() as client:
        body = start_body("demo-slow", action, input={"seconds": 60})
        with client.stream("POST", "/jobs/stream", json=body, headers=KEY) as response:
            next(e for e in sse.events(sse.lines(response.iter_bytes())) if e["event"] == "started")
            cancel = {"crew_id": "demo-slow", "action_id": action, "reason": reason}
            assert client.post(f"/jobs/{action}/cancel", json=cancel).json()["status"] == "cancelled"
    shown = clean(cli(server, "show", action))
    assert "\\x1b[2K\\u009b1Astop" in unwrapped(shown) and "c1\\u009b2J-job" in unwrapped(shown), shown.stdout
    listed = clean(cli(server, "jobs", "--crew", "demo-slow"))
    assert "c1\\u009b2J-job" in unwrapped(listed), listed.stdout
    events = clean(cli(server, "events", action))
    assert "\\u001b[2K\\u009b1Astop" in unwrapped(events), events.stdout


def test_ids_are_percent_encoded_in_paths(server: Server) -> None:
    with server.client() as client:
        for action in ("a", "a?b#c", "50%"):
            assert client.post("/jobs", json=start_body("demo", action), headers=KEY).status_code == 200
    for action in ("a?b#c", "50%"):
        shown = cli(server, "show", action, "--json")
        assert shown.returncode == 0 and orjson.loads(shown.stdout)["action_id"] == action, shown.stderr
        events = cli(server, "events", action, "--json")
        assert events.returncode == 0 and events.stdout.count("\n") >= 3, events.stderr


def test_a_look_alike_id_is_written_out_and_pasted_back(server: Server) -> None:
    """ "t\u0456des" (a Cyrillic і) would read as "tides" in a table: it is shown written out, and that is what
    show, cancel and the others take back."""
    look_alike = "t\u0456des-job"
    with server.client() as client:
        for action in ("tides-job", look_alike):
            assert client.post("/jobs", json=start_body("demo", action), headers=KEY).status_code == 200
    listed = clean(cli(server, "jobs", "--crew", "demo"))
    assert "t\\u0456des-job" in listed.stdout and "tides-job" in listed.stdout, listed.stdout
    assert look_alike not in listed.stdout
    for typed in ("t\\u0456des-job", look_alike):  # as the CLI printed it, or as it is
        shown = cli(server, "show", typed, "--json")
        assert shown.returncode == 0 and orjson.loads(shown.stdout)["action_id"] == look_alike, shown.stderr
    table = clean(cli(server, "show", look_alike))
    assert "t\\u0456des-job" in table.stdout and look_alike not in table.stdout, table.stdout


@contextlib.contextmanager
def hostile_stream(body: bytes) -> Iterator[str]:
    """A loopback HTTP server that answers every GET with ``body`` as an event stream: what a broken proxy or
    an impostor could send. The supervisor itself can no longer be made to write these bytes."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_port}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


def frame(name: str, sequence: int, data: str) -> bytes:
    """``data`` goes out raw: with U+2028 unescaped, as this server wrote it before, or as JSON it is not."""
    event = f'{{"event":"{name}","sequence":{sequence},"data":{data}}}'
    return f"event: {name}\ndata: {event}\nid: {sequence}\n\n".encode()


def test_following_splits_lines_only_at_cr_and_lf(server: Server) -> None:
    body = frame("chunk", 0, '{"content":"hello\u2028world\\n"}') + frame("completed", 1, '{"raw":"x"}')
    with hostile_stream(body) as url:
        followed = clean(cli(server, "events", "x", "--follow", url=url))
    assert followed.returncode == 0, followed.stderr
    assert "hello\\u2028world" in followed.stdout  # one line, the separator written out


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (frame("chunk", 0, '{"content":"\xff"}').replace(b"\xc3\xbf", b"\xff"), "not UTF-8"),
        (frame("chunk", 0, "{not json"), "not JSON"),
    ],
)
def test_an_unreadable_stream_is_one_line(server: Server, body: bytes, says: str) -> None:
    with hostile_stream(body) as url:
        followed = clean(cli(server, "events", "x", "--follow", url=url))
    assert followed.returncode == 1
    assert followed.stderr.count("\n") == 1 and says in followed.stderr, followed.stderr
    assert "Traceback" not in followed.stderr
