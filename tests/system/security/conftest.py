"""One supervisor for the security package, on the test registry plus ``tests/system/security/crews.py``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import Server, start_server, stop_server

REGISTRY = "tests.system.security.crews:registry"


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = start_server(tmp_path_factory.mktemp("security") / "s", env={"AIP_CREWAI_REGISTRY": REGISTRY})
    yield running
    stop_server(running)
