"""The console's job page links a traced job to its trace in the trace UI (``TRACE_UI_URL``): a real supervisor
tracing into a real OTLP/HTTP receiver, the page in a real browser."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from playwright.sync_api import expect

from tests.conftest import start_body, start_server
from tests.helpers.otlp_receiver import OtlpReceiver
from tests.system.browser.test_console import CONSOLE, DEMO, KEY, sign_in

TRACE_UI = "http://localhost:16686/trace/{trace_id}"


def test_a_traced_jobs_page_links_its_trace_in_a_tab_of_its_own(tmp_path: Path, page: Any) -> None:
    with OtlpReceiver() as receiver:
        env = {
            **CONSOLE,
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "AIP_CREWAI_TRACE_UI_URL": TRACE_UI,
        }
        server = start_server(tmp_path / "state", registry=DEMO, env=env)
        with server.client() as client:
            assert client.post("/jobs", json=start_body("demo", "traced"), headers=KEY).status_code == 200
            trace_id = client.get("/jobs/traced").json()["trace_id"]
        assert trace_id is not None
        receiver.wait_for(lambda spans: any(span.trace_id == trace_id for span in spans), timeout=60)
        sign_in(page, server)
        page.goto(f"{server.url}/console/#/jobs/traced")
        row = page.locator("#job-record dt", has_text=re.compile("^trace$"))
        expect(row).to_be_visible()
        link = page.locator("#job-record dd a")
        expect(link).to_have_text(trace_id)
        expect(link).to_have_attribute("href", f"http://localhost:16686/trace/{trace_id}")
        expect(link).to_have_attribute("target", "_blank")
        expect(link).to_have_attribute("rel", re.compile(r"\bnoopener\b"))
