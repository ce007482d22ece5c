"""Fixtures of the job core's tests (``harness.py`` builds the core itself)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


class Phases(logging.Handler):
    """Each job's phases, in order, as ``LiveJob.move`` logs them."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: dict[str, list[str]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == "job phase":
            self.seen.setdefault(record.__dict__["action_id"], []).append(str(record.__dict__["phase"]))


@pytest.fixture(scope="module", autouse=True)
def adopting(subreaper: None) -> None:
    """As the supervisor is, this process is a subreaper: a job's orphans come to it, and a kill reaps them."""


@pytest.fixture
def phases() -> Iterator[dict[str, list[str]]]:
    handler = Phases()
    jobs = logging.getLogger("crew_supervisor.jobs")
    level = jobs.level
    jobs.addHandler(handler)
    jobs.setLevel(logging.DEBUG)
    yield handler.seen
    jobs.removeHandler(handler)
    jobs.setLevel(level)
