"""The issue's low and info rows that are behaviour: Last-Event-ID bounds, duplicate Authorization, the page
cursor bound, bounded error types, no CDN pages, and the ids ``.`` and ``..``."""

from __future__ import annotations

import httpx
import orjson
import pytest

from tests.conftest import Server, start_body, wait_until
from tests.crews.hostile_text import LONG_CLASS_NAME

KEY = {"Idempotency-Key": "k"}
SSE = {"Accept": "text/event-stream"}
# Not sequences: 5,000 digits (past Python's int conversion limit), and 2^63 - 1 and beyond (a resume
# cursor past SQLite's 64-bit integers).
NOT_SEQUENCES = ["5" * 5000, str(2**63 - 1), str(2**63), str(2**64)]


@pytest.fixture(scope="module")
def finished(server: Server) -> dict[str, object]:
    """A completed job and the exact start that observes it again."""
    body = start_body("demo", "resume-1")
    with server.client() as client:
        assert client.post("/jobs", json=body, headers=KEY).status_code == 200
        count = client.get("/jobs/resume-1").json()["event_count"]
    return {"body": body, "event_count": count}


@pytest.mark.parametrize("value", NOT_SEQUENCES)
def test_last_event_id_past_64_bits_is_400_on_every_route(
    server: Server, finished: dict[str, object], value: str
) -> None:
    header = {"Last-Event-ID": value}
    with server.client() as client:
        for route in ("/jobs/stream", "/runs/stream"):
            answer = client.post(route, json=finished["body"], headers={**KEY, **header})
            assert answer.status_code == 400, (route, answer.text)
        new = start_body("demo", "never-admitted")  # refused before admission: nothing starts
        assert client.post("/jobs/stream", json=new, headers={**KEY, **header}).status_code == 400
        assert client.get("/jobs/never-admitted").status_code == 404
        for headers in (header, {**header, **SSE}):
            answer = client.get("/jobs/resume-1/events", headers=headers)
            assert answer.status_code == 400, answer.text


def test_last_event_id_beyond_the_events_is_416_and_within_them_resumes(
    server: Server, finished: dict[str, object]
) -> None:
    count = int(finished["event_count"])  # type: ignore[call-overload]
    with server.client() as client:
        for beyond in (str(count), str(2**63 - 2)):
            header = {**KEY, "Last-Event-ID": beyond}
            assert client.post("/jobs/stream", json=finished["body"], headers=header).status_code == 416
            assert client.get("/jobs/resume-1/events", headers={"Last-Event-ID": beyond}).status_code == 416
        last = {**KEY, "Last-Event-ID": str(count - 2)}  # resume at the terminal event
        resumed = client.post("/jobs/stream", json=finished["body"], headers=last)
        assert resumed.status_code == 200 and resumed.text.startswith("event: completed"), resumed.text


def test_two_authorization_headers_are_400(server: Server) -> None:
    good, bad = f"Bearer {server.token}", "Bearer wrong"
    with httpx.Client(base_url=server.url, trust_env=False) as client:
        assert client.get("/health", headers={"Authorization": good}).status_code == 200
        for pair in ((good, good), (bad, good), (good, bad)):
            headers = [("Authorization", pair[0]), ("Authorization", pair[1])]
            answer = client.get("/health", headers=headers)
            assert answer.status_code == 400 and "Authorization" in answer.json()["detail"], answer.text


def test_every_issued_page_cursor_is_accepted(server: Server) -> None:
    """The longest action id in UTF-8: 256 characters of 4 bytes each, on the last row of a page."""
    widest = "😀" * 256
    with server.client() as client:
        for action in ("page-before", widest):
            assert client.post("/jobs", json=start_body("demo", action), headers=KEY).status_code == 200
        page = client.get("/jobs", params={"limit": 1}).json()
        assert page["jobs"][0]["action_id"] == widest and len(page["next_cursor"]) > 1024
        following = client.get("/jobs", params={"limit": 1, "cursor": page["next_cursor"]})
        assert following.status_code == 200, following.text
        assert following.json()["jobs"][0]["action_id"] == "page-before"


def test_an_error_type_is_bounded_in_events_and_logs(server: Server) -> None:
    with server.client() as client:
        answer = client.post("/jobs", json=start_body("long-error", "long-1"), headers=KEY)
    assert answer.status_code == 502
    terminal = answer.json()["terminal"]
    assert len(terminal["error_type"]) == 256 and terminal["error_type"] == LONG_CLASS_NAME[:255] + "…"
    assert len(terminal["message"]) <= 4096

    def logged() -> list[dict[str, object]]:
        lines = server.log.read_text().splitlines()
        records = [orjson.loads(line) for line in lines if line.startswith("{") and '"long-1"' in line]
        return [record for record in records if record.get("event") == "job finished"]

    assert wait_until(lambda: bool(logged()), timeout=10), server.log_tail()
    assert all(len(orjson.dumps(record)) < 1024 for record in logged())


def test_no_page_loads_scripts_from_a_cdn(server: Server) -> None:
    with server.client() as client:
        for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
            assert client.get(path).status_code == 404, path
        schema = client.get("/openapi.json")
        assert schema.status_code == 200 and "/jobs/stream" in schema.json()["paths"]


@pytest.mark.parametrize("action", [".", ".."])
def test_dot_ids_are_refused_as_other_invalid_ids(server: Server, action: str) -> None:
    with server.client() as client:
        slash = client.post("/jobs", json=start_body("demo", "a/b"), headers=KEY).status_code
        for route in ("/jobs", "/jobs/stream"):
            answer = client.post(route, json=start_body("demo", action), headers=KEY)
            assert answer.status_code == slash == 422 and "'.'" in answer.text, answer.text
