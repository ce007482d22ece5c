"""What each test module costs: ``scripts/test -p tests.helpers.cost`` prints, at the end, each module's CPU
(the pytest process's and that of every process it reaped: supervisors, and through them their fork
servers and workers; browsers; subprocesses) and wall time, the costliest first.

Each xdist worker writes its figures to a file in a temporary directory of the run (``COST_DIR``); the
controller adds them up. A module's fixtures are torn down in its last test, so their
cost is the module's; a process still running when a test ends counts only once reaped.
"""

from __future__ import annotations

import collections
import json
import os
import resource
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ENV = "COST_DIR"
_cpu: collections.Counter[str] = collections.Counter()
_wall: collections.Counter[str] = collections.Counter()


def _cpu_now() -> float:
    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    cpu, wall = _cpu_now(), time.monotonic()
    yield
    module = item.location[0]
    _cpu[module] += _cpu_now() - cpu
    _wall[module] += time.monotonic() - wall


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist): where workers write
        os.environ[ENV] = tempfile.mkdtemp(prefix="pytest-cost-")  # the workers start after this, with it


def pytest_sessionfinish(session: pytest.Session) -> None:
    directory = Path(os.environ[ENV])
    name = os.environ.get("PYTEST_XDIST_WORKER", "controller")
    (directory / f"{name}.json").write_text(json.dumps({"cpu": _cpu, "wall": _wall}))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    cpu: collections.Counter[str] = collections.Counter()
    wall: collections.Counter[str] = collections.Counter()
    for path in Path(os.environ[ENV]).glob("*.json"):
        figures = json.loads(path.read_text())
        cpu.update(figures["cpu"])
        wall.update(figures["wall"])
    terminalreporter.section(f"cost by module: {sum(cpu.values()):.0f} s of CPU in {len(cpu)} modules")
    for module, seconds in cpu.most_common():
        terminalreporter.write_line(f"{seconds:7.1f} s CPU {wall[module]:7.1f} s wall  {module}")
