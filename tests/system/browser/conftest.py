"""A real headless Chromium (Debian's ``chromium``) driven by Playwright, on a real supervisor's console."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

# Where a machine's Chromium is looked for: CHROMIUM names one, else the first of these on PATH.
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
# Headless as root, with nothing reaching out: without the background-networking flags Chromium opens
# connections a closed network refuses, at every start.
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str | None:
    return os.environ.get("CHROMIUM") or next(filter(None, map(shutil.which, CHROMIUM_NAMES)), None)


# Module, not session: Playwright's sync API keeps an event loop running in this thread while it is open, and
# every later test's asyncio.run() would then refuse to start ("cannot be called from a running event loop").
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    executable = chromium_path()
    if executable is None:
        pytest.skip("no Chromium here: apt-get install chromium (or set CHROMIUM); see docs/operating.md")
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=30_000)  # a deadline for a busy machine, not a pace: each waits for its condition
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh tab of its own (its own sessionStorage); console errors of the page fail the test."""
    context = browser.new_context(viewport={"width": 1400, "height": 800})
    tab = context.new_page()
    tab.set_default_timeout(30_000)
    errors: list[str] = []
    tab.on("pageerror", lambda error: errors.append(str(error)))
    tab.on("dialog", lambda dialog: dialog.accept())  # the Cancel button's confirmation
    yield tab
    context.close()
    assert not errors, f"the page threw: {errors}"
