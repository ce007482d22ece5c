"""The front door cannot rot: every shell and Python block of the README, Getting started and Your crews runs.

Each page is followed as a newcomer would follow it, in real shells against a real supervisor: the blocks
before a `crew-supervisor serve` line are that shell's (it serves once they pass: `set -e`), each block
after it runs in another, new shell. Every shell starts in the checkout with a login's environment and
nothing of ours: no virtualenv on PATH (the text activates it), a HOME of its own. Only the port differs
from a reader's machine, so that the test runs beside others: a free one for 8090 (AIP_CREWAI_PORT and
AIP_CREWAI_URL point at it). A Python block is a file the tests import: a snippet of one, or equal to one
in docs/examples/.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import gone
from tests.helpers.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "docs" / "examples"
PAGES = ("README.md", "docs/getting-started.md", "docs/your-crews.md")
SERVE = re.compile(r"^crew-supervisor serve\b")
# Blocks shown but run elsewhere, each with where: running them here would run this suite inside itself.
RUN_ELSEWHERE = {
    "scripts/demo": "tests/system/docs/test_tour.py runs the tour",
    "scripts/test": "this is the suite itself",
}
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
SNIPPET = re.compile(r'^--8<-- "([^"]+)"$')
# A hang guard: doctor (a cold CrewAI import building every crew) then serve (the fork server's warm-up) take
# 30-40 s on a quiet 2-core machine, and up to 7 times that at load 10.
SERVE_SECONDS = 400
CLEAN_ENV = {"PATH", "LANG", "LC_ALL", "TMPDIR"}  # what a new login shell would have of ours


@dataclass
class Block:
    language: str
    text: str

    @property
    def commands(self) -> list[str]:
        """The block's commands, comments and continuation lines joined, as bash would read them."""
        joined = self.text.replace("\\\n", " ")
        return [line.split(" #", 1)[0].strip() for line in joined.splitlines() if line.strip()]


def blocks(page: str) -> list[Block]:
    return [Block(language, text) for language, text in BLOCK.findall((ROOT / page).read_text())]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def as_here(text: str, port: int) -> str:
    return text.replace("8090", str(port))


def shell_env(port: int, home: Path) -> dict[str, str]:
    """A new login shell's environment: no virtualenv on PATH, a HOME of its own, and the port."""
    venv = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if k in CLEAN_ENV}
    env["PATH"] = os.pathsep.join(part for part in env.get("PATH", "").split(os.pathsep) if part != venv)
    return env | {"HOME": str(home), "AIP_CREWAI_PORT": str(port), "AIP_CREWAI_URL": f"http://127.0.0.1:{port}"}


def bash(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["bash", "-e", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    said = f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    assert done.returncode == 0, f"exit {done.returncode}:\n{script}\n{said}"
    return done


@dataclass
class Served:
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    def listening(self) -> bool:
        assert self.process.poll() is None, f"the serving shell exited {self.process.returncode}: {self.said()}"
        try:
            httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2)
        except httpx.TransportError:
            return False
        return True

    def said(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        """SIGTERM, as an orchestrator stops it: it exits by that signal, and every process it had is gone."""
        tree = [self.process.pid, *(child.pid for child in psutil.Process(self.process.pid).children(recursive=True))]
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(60) == -signal.SIGTERM, self.said()
        assert wait_until(lambda: all(gone(pid) for pid in tree), timeout=30), "a process of the server outlived it"


def follow(page: str, tmp_path: Path) -> list[str]:
    """Run ``page``'s shell blocks as its text says; the outputs of the blocks run in other shells."""
    port, home = free_port(), tmp_path / "home"
    home.mkdir()
    first_shell: list[str] = []
    served: Served | None = None
    outputs: list[str] = []
    try:
        for block in blocks(page):
            if block.language != "sh" or set(block.commands) <= set(RUN_ELSEWHERE):
                continue
            text = as_here(block.text, port)
            serve_lines = [line for line in text.splitlines() if SERVE.match(line)]
            if serve_lines:
                assert served is None and serve_lines == [text.splitlines()[-1]], "one serve line, a block's last"
                script = "\n".join([*first_shell, *text.splitlines()[:-1], f"exec {serve_lines[0]}"])
                log = tmp_path / "serving-shell.log"
                with log.open("wb") as out:  # a file, never a pipe nobody reads while it serves
                    process = subprocess.Popen(
                        ["bash", "-e", "-c", script], cwd=ROOT, env=shell_env(port, home),
                        stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                    )  # fmt: skip
                served = Served(process, port, log)
                assert wait_until(served.listening, timeout=SERVE_SECONDS), "the server never listened"
            elif served is None:
                first_shell.append(text)
            else:
                outputs.append(bash(text, shell_env(port, home)).stdout)
        assert served is not None, f"{page} never serves"
        served.stop()
    finally:
        if served is not None and served.process.poll() is None:
            os.killpg(served.process.pid, signal.SIGKILL)
            served.process.wait(30)
    return outputs


def json_values(text: str) -> list[dict[str, object]]:
    """Every JSON object in ``text``, in order (curl ends none of its answers with a newline)."""
    decoder, values, at = json.JSONDecoder(), [], text.find("{")
    while at != -1:
        value, end = decoder.raw_decode(text, at)
        values.append(value)
        at = text.find("{", end)
    return values


@pytest.mark.timeout(SERVE_SECONDS + 300)
def test_the_readme_serves_your_own_crews_and_cancels_with_proof(tmp_path: Path) -> None:
    """A newcomer with their own crew module reaches a served, cancelled job from the README alone."""
    [calls] = follow("README.md", tmp_path)
    answer, started, record, cancelled = json_values(calls)
    assert answer["raw"] and answer["tasks_output"]
    assert "event: started\ndata: " in calls and started["event"] == "started"
    started_data = started["data"]
    assert isinstance(started_data, dict) and started_data["status"] == "running"
    assert record["status"] == "running" and cancelled["status"] == "cancelled"
    terminal = cancelled["terminal"]
    assert isinstance(terminal, dict) and terminal["stop_confirmed"] is True
    assert terminal["pid"] == started_data["pid"] and gone(terminal["pid"])


@pytest.mark.timeout(SERVE_SECONDS + 300)
def test_getting_started_serves_the_demo_crews(tmp_path: Path) -> None:
    [calls] = follow("docs/getting-started.md", tmp_path)
    lines = calls.splitlines()
    assert any(line.startswith("answer: ") for line in lines), calls
    assert any(line.split()[:2] == ["status", "completed"] for line in lines), calls  # show tides
    assert any(line.split()[:4] == ["tides", "demo", "run", "completed"] for line in lines), calls  # jobs
    assert json_values(calls)[-1]["status"] == "ready"


@pytest.mark.timeout(SERVE_SECONDS + 300)
def test_your_crews_runs_and_cancels_from_the_cli(tmp_path: Path) -> None:
    [calls] = follow("docs/your-crews.md", tmp_path)
    assert any(line.startswith("answer: ") for line in calls.splitlines()), calls
    started = json_values(calls)[-1]
    assert started["event"] == "started" and isinstance(started["data"], dict)
    pid = started["data"]["pid"]
    proof = rf"stop confirmed: True, pid {pid}, SIGKILL, 0 descendants killed"
    assert re.search(rf"^long cancelled \({proof}\)$", calls, re.M), calls
    assert gone(pid)


def test_the_readme_is_a_front_door() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250  # depth lives in docs/


@pytest.mark.parametrize("page", PAGES)
def test_every_python_block_is_a_file_the_tests_import(page: str) -> None:
    examples = {path.read_text(): path for path in EXAMPLES.glob("*.py")}
    for block in blocks(page):
        if block.language != "python":
            continue
        included = SNIPPET.match(block.text.strip())
        assert (included and (ROOT / included.group(1)).is_file()) or block.text in examples, (
            f"a Python block of {page} is no file of docs/examples/: copy it from there, or include it"
        )


def test_every_shell_block_is_run_or_says_where_it_runs() -> None:
    for page in PAGES:
        for block in blocks(page):
            assert block.language in {"sh", "python"}, f"{page}: a ```{block.language} block, neither run nor imported"
