"""Off (the default), the browser console costs the supervisor nothing: its module is never imported and
its files are never read. Checked in a fresh interpreter, whose modules are only what the app needed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT

MAKE_APP = """
import sys, types
from supervisor import config
from supervisor.http.app import create_app

settings = config.load({}, {"AIP_CREWAI_REGISTRY": "x:y", "AIP_CREWAI_ALLOW_EPHEMERAL": "true",
                            "AIP_CREWAI_ALLOW_UNAUTHENTICATED": "true", "AIP_CREWAI_CONSOLE": sys.argv[1]})
# create_app reads only these two of the supervisor until the app starts.
app = create_app(types.SimpleNamespace(settings=settings, metrics=None, credentials=None))
print("supervisor.http.webconsole" in sys.modules)
"""


@pytest.mark.parametrize(("setting", "loaded"), [("false", "False"), ("true", "True")])
def test_the_console_is_loaded_only_when_on(setting: str, loaded: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", MAKE_APP, setting], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split("\n")[0] == loaded
