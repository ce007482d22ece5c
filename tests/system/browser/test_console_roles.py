"""The console signed in with an observer's token: every view reads, and what the token may not do (cancel, a job's
stacks) says so where it was asked, in words, the page going on."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from playwright.sync_api import expect

from tests.conftest import start_server
from tests.system.browser.test_console import CONSOLE, DEMO, sign_in, start_job

REFUSED = "403: an observer token may not"


def test_an_observer_s_console_reads_everything_and_says_what_it_may_not_do(tmp_path: Path, page: Any) -> None:
    observer = secrets.token_urlsafe(16)
    (tmp_path / "observers").write_text(f"{observer}\n")
    (tmp_path / "observers").chmod(0o600)
    env = {**CONSOLE, "AIP_CREWAI_OBSERVER_TOKEN_FILE": str(tmp_path / "observers")}
    server = start_server(tmp_path / "state", registry=DEMO, env=env)
    pid = start_job(server, "watched-by-an-observer", seconds=60)
    sign_in(page, server, token=observer)
    expect(page.locator("#health-status")).to_have_text("ready")
    row = page.locator('#workers tr[data-action-id="watched-by-an-observer"]')
    expect(row.locator("td.pid")).to_have_text(str(pid))
    row.locator("button", has_text="Cancel").click()
    evidence = page.locator("#evidence")
    expect(evidence).to_contain_text(f"Cancel of watched-by-an-observer refused: {REFUSED} POST")
    expect(evidence).to_contain_text("that needs an operator token or the contract's token")
    with server.client() as client:
        assert client.get("/jobs/watched-by-an-observer").json()["status"] == "running"
    page.goto(f"{server.url}/console/#/jobs/watched-by-an-observer")
    expect(page.locator('#events li[data-event="chunk"]').first).to_be_visible()  # its events stream to an observer
    page.click("#job-stacks")
    expect(page.locator("#stacks")).to_contain_text(f"{REFUSED} GET /jobs/{{action_id}}/stack")
    page.goto(f"{server.url}/console/#/jobs")
    expect(page.locator("#jobs tbody tr a", has_text="watched-by-an-observer")).to_be_visible()
    expect(page.locator("#login-form")).to_be_hidden()  # still signed in: a 403 is not a 401
