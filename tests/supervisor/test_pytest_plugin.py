"""The pytest plugin as its user gets it: their test files, run by pytest in a subprocess that loads the plugin
through the entry point pyproject.toml declares, each test starting a real supervisor on the demo crews."""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path

import pytest

from tests.conftest import ROOT, gone, wait_until

pytest_plugins = ["pytester"]

RUN_SECONDS = 400  # each supervisor takes 5 s to be ready on an idle machine (CrewAI loads), 30 s on a busy one
TESTING_PAGE = ROOT / "docs" / "testing-your-crews.md"
TOOL_CREW = ("tide_crews.py", "test_tide_crews.py")  # in docs/examples/: a crew with a tool, and its tests


@pytest.fixture
def user(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A user's project on the demo crews, with crew-supervisor installed: this tree importable and the plugin's
    entry point, as pyproject.toml declares it, in a distribution's metadata on the path."""
    site = pytester.mkdir("site")
    dist = site / "crew_supervisor_checkout-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: crew-supervisor-checkout\nVersion: 0\n")
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["pytest11"]
    (dist / "entry_points.txt").write_text("[pytest11]\n" + "".join(f"{k} = {v}\n" for k, v in declared.items()))
    path = [str(ROOT), str(site), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, path)))
    pytester.makeini("[pytest]\ncrew_registry = worker.demo:registry\n")
    return pytester


def documented_example() -> str:
    """The test of a crew's cancel that docs/testing-your-crews.md shows, as a user would copy it."""
    found = re.search(r"```python\n(.*?)```", TESTING_PAGE.read_text(), re.DOTALL)
    assert found
    return found.group(1)


FAILING = """
import json
import os

from supervisor.console import sse


def test_fails_while_its_crew_runs(crew_supervisor, crew_client):
    job = {"crew_id": "demo-slow", "action_id": "job-2"}
    with crew_client.stream("POST", "/jobs/stream", json=job, headers={"Idempotency-Key": "k"}) as stream:
        started = next(sse.events(sse.lines(stream.iter_bytes())))
        tree = [crew_supervisor.process.pid, *(p.pid for p in crew_supervisor.processes())]
        with open(os.environ["CREW_TEST_EVIDENCE"], "w") as evidence:
            json.dump({"worker": started["data"]["pid"], "tree": tree}, evidence)
        raise AssertionError("the user's test fails while its crew runs")
"""


@pytest.mark.timeout(RUN_SECONDS + 60)
def test_a_users_cancel_test_passes_and_a_failing_one_leaves_no_process(
    user: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    evidence = tmp_path / "evidence.json"
    monkeypatch.setenv("CREW_TEST_EVIDENCE", str(evidence))
    user.makepyfile(test_cancel=documented_example(), test_failing=FAILING)
    result = user.runpytest_subprocess("-p", "no:cacheprovider", timeout=RUN_SECONDS)
    result.assert_outcomes(passed=1, failed=1)  # and no error: no teardown found a process left behind
    result.stdout.fnmatch_lines(["plugins:*crew-supervisor-checkout-0*"])  # loaded through the entry point
    ran = json.loads(evidence.read_text())
    assert ran["worker"] in ran["tree"]  # with the supervisor, its fork server and idle workers
    assert wait_until(lambda: all(gone(pid) for pid in ran["tree"]))  # gone once their parent (init) reaps them


SETTINGS = """
import pytest

pytest_plugins = ["supervisor.pytest_plugin"]  # also loaded by its entry point and by -p: registered once


@pytest.fixture(scope="session")
def crew_supervisor_settings():
    return {"allowed_operations": "run,test", "stream_checkpoint_events": 7}
"""

MARKERS = """
import pytest

pytestmark = pytest.mark.crew_supervisor(allowed_operations="run,memory_reset")


def health(server):
    with server.client() as client:
        return client.get("/health").json()


@pytest.mark.crew_supervisor(launcher="spawn")
def test_the_closest_marker_wins_then_the_module_marker_then_the_settings(crew_supervisor):
    seen = health(crew_supervisor)
    assert seen["launcher"] == "spawn"
    assert "memory_reset" in seen["operations"] and "test" not in seen["operations"]
    assert seen["stream_checkpoint_events"] == 7


def test_the_module_supervisor_has_the_module_marker(crew_supervisor_module):
    seen = health(crew_supervisor_module)
    assert seen["launcher"] == "forkserver" and "memory_reset" in seen["operations"]


def test_the_session_supervisor_has_the_settings_only(crew_supervisor_session):
    seen = health(crew_supervisor_session)
    assert "test" in seen["operations"] and "memory_reset" not in seen["operations"]
"""


@pytest.mark.timeout(RUN_SECONDS + 60)
def test_settings_and_markers_reach_the_supervisor(user: pytest.Pytester) -> None:
    user.makeconftest(SETTINGS)
    user.makepyfile(test_markers=MARKERS)
    result = user.runpytest_subprocess("-p", "no:cacheprovider", "-p", "supervisor.pytest_plugin", timeout=RUN_SECONDS)
    result.assert_outcomes(passed=3)


def test_without_a_registry_the_test_errors_saying_how_to_give_one(user: pytest.Pytester) -> None:
    user.makeini("[pytest]\n")
    user.makepyfile(test_ready="def test_ready(crew_supervisor):\n    pass\n")
    result = user.runpytest_subprocess("-p", "no:cacheprovider", timeout=RUN_SECONDS)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*no crew registry: give --crew-registry, the crew_registry ini option or*"])


@pytest.mark.timeout(RUN_SECONDS + 60)
def test_the_documented_tests_of_a_crew_with_a_tool_pass_on_the_scripted_provider(user: pytest.Pytester) -> None:
    """docs/examples' crew with a tool and its tests, copied as a user would: its model scripted, the tool run
    in a job's worker (its run streamed) and in the test's process (not), a 429 retried, a spent script failing."""
    user.makeini("[pytest]\ncrew_registry = tide_crews:registry\n")
    for name in TOOL_CREW:
        (user.path / name).write_text((ROOT / "docs" / "examples" / name).read_text())
    result = user.runpytest_subprocess("-p", "no:cacheprovider", timeout=RUN_SECONDS)
    result.assert_outcomes(passed=4)


def test_the_page_shows_the_crew_with_a_tool_and_its_tests_whole() -> None:
    page = TESTING_PAGE.read_text()
    for name in TOOL_CREW:
        assert f"```python\n{(ROOT / 'docs' / 'examples' / name).read_text()}```" in page, name
