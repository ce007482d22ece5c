"""Server-level tests run on the default fork server; those marked ``both_launchers`` (killing, reaping
and fencing, where a spawned worker is our own child and a forked one is not) run on ``spawn`` too.

tests/supervisor, tests/worker and tests/system/docs take these three names in their conftests; the other system
suites run on the default launcher alone."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import SETTINGS


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "launcher" in metafunc.fixturenames:
        both = metafunc.definition.get_closest_marker("both_launchers") is not None
        launchers = ["forkserver", "spawn"] if both else ["forkserver"]
        metafunc.parametrize("launcher", launchers, indirect=True, scope="module")


@pytest.fixture(scope="module")
def launcher(request: pytest.FixtureRequest) -> Iterator[str]:
    """Servers started while this is active use the launcher; ``start_server`` passes the environment on."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(os.environ, "AIP_CREWAI_LAUNCHER", request.param)
        yield request.param


@pytest.fixture(scope="module")
def crew_supervisor_settings(launcher: str) -> dict[str, Any]:
    """The shared ``server`` runs on the module's launcher (and starts once it is set)."""
    return {**SETTINGS, "launcher": launcher}
