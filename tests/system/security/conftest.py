"""One supervisor for the security package, on the one registry plus ``tests/crews/hostile_text.py``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import Server, start_server, stop_server

REGISTRY = "tests.crews.hostile_text:registry"


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = start_server(tmp_path_factory.mktemp("security") / "s", env={"AIP_CREWAI_REGISTRY": REGISTRY})
    yield running
    stop_server(running)
