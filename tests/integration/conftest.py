"""Every server-level module runs once per launcher (as pebble runs its suite per start method)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module", params=["forkserver", "spawn"])
def launcher(request: pytest.FixtureRequest) -> Iterator[str]:
    """Servers started while this is active use the launcher; ``start_server`` passes the environment on."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(os.environ, "AIP_CREWAI_LAUNCHER", request.param)
        yield request.param
