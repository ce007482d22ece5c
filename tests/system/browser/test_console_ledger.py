"""The console's job page shows the job's effect ledger: each tool and LLM call, a failed one with its error, an
uncertain one (cut off by the job's cancel) standing out. The ``effects`` crew (``tests/crews/effects.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from playwright.sync_api import expect

from tests.conftest import start_body, start_server
from tests.crews.effects import EFFECTS_LOG
from tests.helpers.waiting import wait_until
from tests.system.browser.test_console import CONSOLE, sign_in


def test_a_job_page_shows_its_ledger_a_failed_call_with_its_error_and_an_uncertain_one_standing_out(
    tmp_path: Path, page: Any
) -> None:
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    env = {**CONSOLE, "CREW_TEST_EVIDENCE_DIR": str(evidence), "AIP_CREWAI_STOP_GRACE_MS": "200"}
    server = start_server(tmp_path / "state", env=env)
    body = start_body(
        "effects",
        "reconcile-me",
        input={"marker": "reconcile-me", "fail_in_step": 1, "hang_in_step": 2},
        timeout_ms=120_000,
    )
    with server.client() as client:
        with client.stream("POST", "/jobs/stream", json=body, headers={"Idempotency-Key": "k"}) as stream:
            assert stream.status_code == 200
        log = evidence / EFFECTS_LOG
        assert wait_until(lambda: log.exists() and "reconcile-me step 2 begun" in log.read_text(), timeout=120)
        cancelled = client.post("/jobs/reconcile-me/cancel", json={"crew_id": "effects", "action_id": "reconcile-me"})
        assert cancelled.json()["status"] == "cancelled", cancelled.text
    sign_in(page, server)
    page.goto(f"{server.url}/console/#/jobs/reconcile-me")
    effects = page.locator("#job-effects")
    expect(effects).to_be_visible()
    failed = page.locator("#effects tbody tr.effect-failed").first
    expect(failed.locator("td.name")).to_have_text("record_effect")
    expect(failed.locator("td.error")).to_have_text("RuntimeError: tool failed at step 1")
    uncertain = page.locator("#effects tbody tr.effect-uncertain")
    expect(uncertain).to_have_count(1)
    expect(uncertain.locator("td.status-uncertain")).to_have_text("uncertain")
    expect(uncertain.locator("td.name")).to_have_text("record_effect")
    assert uncertain.evaluate("row => getComputedStyle(row).backgroundColor") == "rgb(255, 248, 197)"  # it stands out
    expect(page.locator("#effects-summary")).to_contain_text("1 uncertain")
    expect(page.locator("#effects-summary")).to_contain_text("1 task(s) completed")
    expect(page.locator("#effects tbody tr.effect-running")).to_have_count(0)
