"""The operator console in a real browser: sign in, watch workers, cancel with evidence, follow a job,
page through jobs, and keep working while the supervisor restarts under the page."""

from __future__ import annotations

import http.client
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from playwright.sync_api import expect

from supervisor.testing import Server
from tests.conftest import gone, sse_events, start_body, start_server, stop_server
from tests.helpers.waiting import wait_until

DEMO = "worker.demo:registry"
CONSOLE = {"AIP_CREWAI_CONSOLE": "true"}
# The screenshot in docs/operating.md, written here when set (scripts/test leaves it unset).
SCREENSHOT = os.environ.get("CONSOLE_SCREENSHOT")
JOB_SCREENSHOT = os.environ.get("CONSOLE_JOB_SCREENSHOT")  # the job page's, likewise
KEY = {"Idempotency-Key": "key-1"}


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_server(tmp_path_factory.mktemp("console") / "state", registry=DEMO, env=CONSOLE)
    yield server
    stop_server(server)


def start_job(server: Server, action: str, crew: str = "demo-slow", **inputs: Any) -> int:
    """Starts a job and returns its worker's pid once it has started (a stream dropped does not cancel it)."""
    body = start_body(crew, action, input={"topic": "the console", **inputs})
    with (
        server.client() as client,
        client.stream("POST", "/jobs/stream", json=body, headers={"Idempotency-Key": action}) as response,
    ):
        assert response.status_code == 200, response.read()
        for event in sse_events(response):
            if event["event"] == "started":
                return int(event["data"]["pid"])
    raise AssertionError(f"{action} never started")


def sign_in(page: Any, server: Server, token: str | None = None) -> None:
    page.goto(f"{server.url}/console")
    page.fill("#token", token or server.token)
    page.click("#login-form button")


def test_a_wrong_token_shows_a_message_and_no_data_then_the_right_one_signs_in(console: Server, page: Any) -> None:
    start_job(console, "signin-running", seconds=20)
    sign_in(page, console, token="not-the-token")
    expect(page.locator("#login-error")).to_contain_text("refused that token (401)")
    for view in ("#workers-view", "#jobs-view", "#job-view", "#health"):
        expect(page.locator(view)).to_be_hidden()
    assert page.locator("#workers tbody tr").count() == 0
    assert page.evaluate("sessionStorage.length") == 0

    page.fill("#token", console.token)
    page.click("#login-form button")
    expect(page.locator("#health-status")).to_have_text("ready")
    expect(page.locator('#workers tr[data-action-id="signin-running"]')).to_be_visible()
    expect(page.locator("#login")).to_be_hidden()
    # The token is kept for this tab: a reload stays signed in.
    page.reload()
    expect(page.locator("#health-status")).to_have_text("ready")


def raw_get(server: Server, path: str, method: str = "GET", token: str | None = None) -> int:
    """The status of ``path`` sent exactly as written (httpx would resolve ``..`` before sending)."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.request(method, path, headers={"Authorization": f"Bearer {token}"} if token else {})
        return connection.getresponse().status
    finally:
        connection.close()


def test_the_page_is_served_with_a_strict_policy_and_without_a_token(console: Server) -> None:
    with console.client(token="wrong") as client:
        page = client.get("/console/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        policy = page.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy and "unsafe" not in policy
        assert page.headers["x-frame-options"] == "DENY"
        scripts = re.findall(r"<script[^>]*>", page.text)
        assert scripts and all(" src=" in tag for tag in scripts), "no inline script"
        assert "http" not in page.text.replace("http-equiv", ""), "nothing fetched from elsewhere"
        assert client.get("/console", follow_redirects=False).headers["location"] == "/console/"
        assert client.get("/console/console.js").headers["content-type"].startswith("text/javascript")
        names = client.get("/console/names.js")  # made from the enums, served as the files are
        assert (
            names.headers["content-type"].startswith("text/javascript") and names.headers["x-frame-options"] == "DENY"
        )
        assert names.headers["content-security-policy"] == policy and "export const STATUS = " in names.text
    # Only the page's own files are public, read: nothing else, however the path is spelt or the method.
    for path in (
        "/console/nothing-here",
        "/console/../jobs",
        "/console/%2e%2e/workers",
        "/console//workers",
        "/console/console.js/../../jobs",
        "/consolex",
        "/workers",
        "/jobs",
        "/metrics",
    ):
        assert raw_get(console, path) == 401, path
    assert raw_get(console, "/console/", method="POST") == 401
    assert raw_get(console, "/console/nothing-here", token=console.token) == 404


def test_a_running_job_appears_in_the_worker_view_and_its_cancel_shows_the_evidence(
    console: Server, page: Any, tmp_path: Path
) -> None:
    pid = start_job(console, "runaway-in-the-page", seconds=60)
    page.set_viewport_size({"width": 800, "height": 330})  # a laptop's half screen: it must fit
    sign_in(page, console)
    row = page.locator('#workers tr[data-action-id="runaway-in-the-page"]')
    expect(row.locator("td.pid")).to_have_text(str(pid))
    expect(row.locator("td.phase")).to_have_text("running")
    expect(row.locator("td.id")).to_contain_text("demo-slow · run")
    # What the job costs as its cap measures it (the kernel's charge, or PSS), against that cap.
    expect(row.locator("td.memory")).to_contain_text(re.compile(r"MiB\s*of 2048 MiB · (cgroup|pss)"))
    expect(row.locator("td.memory meter")).to_have_attribute("max", str(2048 * 1024 * 1024))
    expect(row.locator("td.cpu")).to_contain_text("scale 0–")
    expect(row.locator("td.left")).to_have_text(re.compile(r"^\d+m \d+s$"))  # of its 10 minutes' timeout
    expect(row.locator("td.idle")).to_contain_text(" s")
    # Refreshed every second: the sparkline gains a point each time (eight here, for the picture in docs/operating.md).
    expect(row.locator("td.cpu polyline")).to_have_attribute("points", re.compile(r"^(\S+ ){7}\S+"))
    assert page.evaluate("document.documentElement.scrollWidth") <= 800, "the worker view is wider than 800 px"
    picture = tmp_path / "console-workers.png"
    page.screenshot(path=picture, full_page=True)
    if SCREENSHOT:
        shutil.copyfile(picture, SCREENSHOT)

    row.locator("button", has_text="Cancel").click()
    evidence = page.locator("#evidence")
    expect(evidence).to_contain_text("runaway-in-the-page cancelled: stop confirmed")
    expect(evidence).to_contain_text(f"worker pid {pid}")
    expect(evidence).to_contain_text("SIGKILL")
    assert gone(pid), f"the page said stopped, but pid {pid} runs: {psutil.Process(pid)}"
    expect(row).to_have_count(0)  # it leaves the worker view


def test_the_worker_view_says_what_a_queued_job_waits_for(tmp_path: Path, page: Any) -> None:
    env = {**CONSOLE, "AIP_CREWAI_CREW_MAX_CONCURRENCY": "demo-slow=1"}
    server = start_server(tmp_path / "state", registry=DEMO, env=env)
    start_job(server, "bound-running", seconds=60)
    body = start_body("demo-slow", "bound-waiting", input={"topic": "the console", "seconds": 60})
    with (
        server.client() as client,
        client.stream("POST", "/jobs/stream", json=body, headers={"Idempotency-Key": "bound-waiting"}) as response,
    ):
        assert response.status_code == 200  # admitted: it waits for its crew's one slot
    sign_in(page, server)
    waiting = page.locator('#workers tr[data-action-id="bound-waiting"] td.phase')
    expect(waiting).to_contain_text("queued")
    expect(waiting).to_contain_text("waits for crew demo-slow (1/1 running)")
    running = page.locator('#workers tr[data-action-id="bound-running"] td.phase')
    expect(running).to_have_text("running")  # nothing said of a job that does not wait


def test_a_streamed_job_is_followed_live_to_its_terminal_event(console: Server, page: Any) -> None:
    start_job(console, "followed", seconds=10)
    sign_in(page, console)
    page.goto(f"{console.url}/console/#/jobs/followed")  # a job's address is the API's path
    expect(page.locator("#job-id")).to_have_text("followed")
    events = page.locator("#events li")
    expect(events.first).to_have_attribute("data-event", "started")
    # Live: events arrive while the job still runs, not only replayed once it has ended.
    expect(page.locator("#job-record")).to_contain_text("running")
    expect(page.locator('#events li[data-event="chunk"]').first).to_be_visible()
    with console.client() as client:
        assert client.get("/jobs/followed").json()["status"] == "running"
    expect(page.locator("#events-state")).to_have_text("ended: completed", timeout=60_000)
    expect(events.last).to_have_attribute("data-event", "completed")
    count = events.count()
    with console.client() as client:
        assert count == client.get("/jobs/followed").json()["event_count"]
    sequences = [int(text) for text in page.locator("#events li .seq").all_inner_texts()]
    assert sequences == list(range(count)), "every event once, in order"
    expect(page.locator("#job-record")).to_contain_text("completed")
    expect(page.locator("#job-cancel")).to_be_hidden()


def test_a_job_page_shows_the_answer_its_tasks_and_tokens_or_why_it_failed_and_json_only_when_asked(
    console: Server, page: Any, tmp_path: Path
) -> None:
    start_job(console, "answered", crew="demo", mode="quick")
    with console.client() as client:
        assert wait_until(lambda: client.get("/jobs/answered").json()["status"] == "completed", timeout=60)
        output = client.get("/jobs/answered").json()["output"]
        timed_out = client.post("/jobs", json=start_body("demo-slow", "timed-out", timeout_ms=1500), headers=KEY)
        assert timed_out.status_code == 502, timed_out.text
    page.set_viewport_size({"width": 800, "height": 900})
    sign_in(page, console)
    page.goto(f"{console.url}/console/#/job/answered")  # the address the console's links gave before: kept
    expect(page.locator("#events-state")).to_have_text("ended: completed")
    expect(page.locator("#answer")).to_have_text(output["raw"])  # the answer first, as text
    tasks = page.locator("#tasks li")
    expect(tasks).to_have_count(len(output["tasks_output"]))
    for task, shown in zip(output["tasks_output"], tasks.all(), strict=True):
        expect(shown.locator("strong")).to_have_text(task["agent"])
        expect(shown.locator("pre")).to_have_text(task["raw"])
    total = f"{output['token_usage']['total_tokens']:,}"
    expect(page.locator("#usage")).to_contain_text(re.compile(rf"total\s*{re.escape(total)}"))
    expect(page.locator("#job-record")).to_contain_text(re.compile(r"took\s*\d+(\.\d)? s"))
    expect(page.locator('#events li[data-event="completed"]')).to_contain_text("the output: shown above")
    assert page.evaluate("document.documentElement.scrollWidth") <= 800
    expect(page.locator("#raw")).to_be_hidden()  # JSON only behind its toggle
    picture = tmp_path / "console-job.png"
    page.screenshot(path=picture, full_page=True)
    if JOB_SCREENSHOT:
        shutil.copyfile(picture, JOB_SCREENSHOT)
    page.click("#job-raw summary")
    expect(page.locator("#raw")).to_contain_text('"tasks_output"')

    page.goto(f"{console.url}/console/#/job/timed-out")
    why = page.locator("#job-why")
    expect(why).to_contain_text("Failed: it reached its timeout")
    expect(why).to_contain_text("TimeoutError: job exceeded timeout_ms=1500")
    expect(why).to_contain_text("uncertain outcome")
    expect(why).to_contain_text("stop confirmed: worker pid")
    expect(page.locator("#job-answer")).to_be_hidden()
    expect(page.locator("#job-record")).not_to_contain_text("exit status 0")  # a failure never reads as success

    page.goto(f"{console.url}/console/#/jobs?crew_id=demo-slow&status=failed")
    row = page.locator("#jobs tbody tr", has_text="timed-out")
    expect(row.locator("td.reason")).to_have_text("timeout")
    expect(row).to_contain_text(re.compile(r"\d+(\.\d)? s"))  # how long it took


def test_leaving_a_job_aborts_its_calls_so_a_late_answer_never_lands_in_the_next_page(
    console: Server, page: Any
) -> None:
    start_job(console, "answered-late", crew="demo", mode="quick")
    sign_in(page, console)
    held: list[Any] = []
    page.route("**/jobs/answered-late", lambda route: held.append(route))  # asked for, never answered
    with page.expect_request("**/jobs/answered-late"):
        page.goto(f"{console.url}/console/#/job/answered-late")
    with page.expect_event("requestfailed", lambda request: request.url.endswith("/jobs/answered-late")):
        page.evaluate("location.hash = '#/job/no-such-job'")
    expect(page.locator("#job-id")).to_have_text("no-such-job")
    expect(page.locator("#view-error")).to_contain_text("404")
    assert page.locator("#job-record").inner_text() == ""
    page.evaluate("location.hash = '#/job/%E0'")  # not percent-encoding of anything
    expect(page.locator("#view-error")).to_contain_text("names no job")


def test_the_job_list_filters_and_pages(console: Server, page: Any) -> None:
    for n in range(3):
        start_job(console, f"listed-{n}", crew="demo", mode="quick")
    with console.client() as client:

        def completed() -> int:
            return len(client.get("/jobs", params={"crew_id": "demo", "status": "completed"}).json()["jobs"])

        assert wait_until(lambda: completed() >= 3, timeout=60)
    sign_in(page, console)
    page.goto(f"{console.url}/console/#/jobs?crew_id=demo&limit=2")
    rows = page.locator("#jobs tbody tr")
    expect(rows).to_have_count(2)
    first_page = rows.all_inner_texts()
    expect(page.locator("#jobs-newer")).to_be_disabled()
    page.click("#jobs-older")
    expect(page.locator("#jobs-page")).to_have_text("page 2")
    expect(rows.first).not_to_have_text(first_page[0])
    assert all("demo" in text for text in rows.all_inner_texts())
    page.click("#jobs-newer")
    expect(page.locator("#jobs-page")).to_have_text("page 1")
    first_id = page.locator("#jobs tbody tr a").first
    opened = first_id.inner_text()
    first_id.click()  # a job's link is its address: #/jobs/<id>
    expect(page).to_have_url(re.compile(r"#/jobs/[^?]+$"))
    expect(page.locator("#job-id")).to_have_text(opened)
    page.go_back()
    expect(rows).to_have_count(2)

    page.select_option('#filters select[name="status"]', "cancelled")
    page.click("#filters button")
    expect(page).to_have_url(re.compile(r"status=cancelled"))
    expect(page.locator("#jobs-empty")).to_be_visible()  # no demo job was cancelled


def test_a_failed_job_s_page_shows_the_exception_its_crew_raised(console: Server, page: Any) -> None:
    """demo-llm with no provider listening: the openai SDK raises, the event says the reference's generic words,
    and the page shows what the crew raised, its traceback behind it."""
    with console.client() as client:
        body = start_body("demo-llm", "raised-in-the-page")
        failed = client.post("/jobs", json=body, headers={"Idempotency-Key": "raised"})
        assert failed.status_code == 502 and failed.json()["terminal"]["message"] == "CrewAI operation failed"
    sign_in(page, console)
    page.goto(f"{console.url}/console/#/jobs/raised-in-the-page")
    expect(page.locator("#job-why")).to_contain_text("Failed: the crew raised an error")
    raised = page.locator("#job-raised")
    said = re.compile(r"^The crew raised \S*APIConnectionError: Connection error")
    expect(raised.locator("summary")).to_have_text(said)
    expect(page.locator("#raised")).to_be_hidden()  # the traceback behind its summary
    raised.locator("summary").click()
    expect(page.locator("#raised")).to_contain_text("Traceback (most recent call last):")


def test_the_stacks_button_shows_where_a_running_job_is_and_where_a_cancelled_one_was(
    console: Server, page: Any
) -> None:
    pid = start_job(console, "stacked-in-the-page", seconds=60)
    sign_in(page, console)
    page.goto(f"{console.url}/console/#/jobs/stacked-in-the-page")
    expect(page.locator("#job-record")).to_contain_text("running")
    # Its model ticks once a chunk has come: `started` alone comes before the call, and a snapshot taken then (the
    # full suite's load) held no call to show.
    expect(page.locator('#events li[data-event="chunk"]').first).to_be_attached()
    page.click("#job-stacks")
    stacks = page.locator("#stacks")
    expect(stacks).to_contain_text("Thread MainThread")
    expect(stacks).to_contain_text(re.compile(r"worker/demo\.py\", line \d+, in call"))  # the model's call, ticking
    expect(page.locator("#stacks-when")).to_contain_text("taken at")
    with console.client() as client:
        assert client.get("/jobs/stacked-in-the-page").json()["status"] == "running"  # it goes on
        body = {"crew_id": "demo-slow", "action_id": "stacked-in-the-page", "reason": "seen"}
        assert client.post("/jobs/stacked-in-the-page/cancel", json=body).json()["status"] == "cancelled"
    assert gone(pid)
    expect(page.locator("#events-state")).to_have_text("ended: cancelled")
    page.click("#job-stacks")
    expect(page.locator("#stacks-when")).to_contain_text("just before its cancel kill")
    expect(stacks).to_contain_text(re.compile(r"worker/demo\.py\", line \d+, in call"))


def test_a_look_alike_id_is_written_out_as_the_cli_writes_it(console: Server, page: Any) -> None:
    """ "t\u0456des" (a Cyrillic і) would read as "tides": the list and the job page write it out."""
    look_alike = "t\u0456des-in-the-page"
    with console.client() as client:
        answer = client.post("/jobs", json=start_body("demo", look_alike), headers={"Idempotency-Key": "look-alike"})
        assert answer.status_code == 200, answer.text
    sign_in(page, console)
    page.goto(f"{console.url}/console/#/jobs?crew_id=demo")
    link = page.locator("#jobs tbody tr a", has_text="t\\u0456des-in-the-page")
    expect(link).to_have_count(1)
    expect(page.locator("#jobs")).not_to_contain_text(look_alike)
    link.click()
    expect(page.locator("#job-id")).to_have_text("t\\u0456des-in-the-page")
    expect(page.locator("#events-state")).to_have_text("ended: completed")  # the link opened that very job


def test_the_page_keeps_working_when_the_supervisor_restarts_under_it(tmp_path: Path, page: Any) -> None:
    state = tmp_path / "state"
    first = start_server(state, registry=DEMO, env=CONSOLE)
    pid = start_job(first, "interrupted", seconds=120)
    sign_in(page, first)
    page.goto(f"{first.url}/console/#/job/interrupted")
    expect(page.locator("#events li").first).to_have_attribute("data-event", "started")

    first.shut_down(kill=True)  # SIGKILL, as a crash: the worker dies with it
    assert wait_until(lambda: gone(pid), timeout=10)
    expect(page.locator("#banner")).to_contain_text("Cannot reach the supervisor")

    # The same address and token: the page keeps what it was given.
    second = start_server(state, registry=DEMO, env=CONSOLE, port=first.port, token=first.token)
    expect(page.locator("#banner")).to_contain_text("restarted")
    # The interrupted job was fenced at start-up; the page resumes its events and reads the terminal one.
    expect(page.locator("#events-state")).to_have_text("ended: failed", timeout=60_000)
    expect(page.locator("#events li").last).to_have_attribute("data-event", "failed")
    sequences = [int(text) for text in page.locator("#events li .seq").all_inner_texts()]
    assert sequences == list(range(len(sequences))), "resumed after the last event shown: none twice, none lost"
    page.click('nav a[href="#/workers"]')
    expect(page.locator("#workers-empty")).to_be_visible()
    stop_server(second)
