"""The scripted provider as the pytest plugin runs it: ``python -m worker.provider`` in a process of its own,
scripted and read over HTTP, stopped for good. A crew on it: tests/supervisor/test_pytest_plugin.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import httpx
import psutil
import pytest

from supervisor import llm_script
from supervisor.llm_script import ScriptedProvider, ScriptedProviderError, answer, error, tool_call
from tests.conftest import ROOT
from tests.helpers.waiting import wait_until
from worker import provider as worker_provider

MESSAGES = [{"role": "user", "content": "When is high tide?"}]


@pytest.fixture
def scripted() -> Iterator[ScriptedProvider]:
    running = ScriptedProvider.start()
    yield running
    running.stop()


def ask(scripted: ScriptedProvider, model: str) -> httpx.Response:
    body = {"model": model, "messages": MESSAGES}
    return httpx.post(f"{scripted.url}/chat/completions", json=body, timeout=30, trust_env=False)


def test_each_model_gets_its_replies_in_order_and_the_calls_are_read_back(scripted: ScriptedProvider) -> None:
    scripted.script(tool_call("tide_times", {"port": "Brest"}), answer("06:12"))
    scripted.script(error(503, "down for maintenance"), model="other")
    (call,) = ask(scripted, "gpt-4o-mini").json()["choices"][0]["message"]["tool_calls"]
    assert call["function"] == {"name": "tide_times", "arguments": '{"port":"Brest"}'}
    refused = ask(scripted, "other")
    assert refused.status_code == 503 and refused.json()["error"]["message"] == "down for maintenance"
    assert ask(scripted, "gpt-4o-mini").json()["choices"][0]["message"]["content"] == "06:12"
    assert [c["status"] for c in scripted.calls()] == [200, 503, 200]
    (other,) = scripted.calls("other")
    assert other["messages"] == MESSAGES and other["stream"] is False
    scripted.reset()
    assert scripted.calls() == []


def test_a_reply_of_no_known_form_is_refused_saying_what_a_reply_is(scripted: ScriptedProvider) -> None:
    with pytest.raises(ScriptedProviderError, match=r"a reply is \{\"content\": text\}"):
        scripted.script({"text": "06:12"})
    with pytest.raises(ScriptedProviderError, match="400 to 599"):
        scripted.script(error(200))


def test_it_stops_for_good_and_names_the_variable_crews_read() -> None:
    running = ScriptedProvider.start()
    running.stop()
    assert running.process.returncode == 0  # it exited on SIGTERM, its connections closed
    with pytest.raises(httpx.ConnectError):
        ask(running, "gpt-4o-mini")
    assert llm_script.URL_ENV == worker_provider.URL_ENV


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_it_ends_with_the_process_that_started_it_even_one_killed() -> None:
    """A test session SIGKILLed (a CI timeout) must not leave the provider serving its recorded calls."""
    parent_code = (
        "import sys, time\n"
        "from supervisor.llm_script import ScriptedProvider\n"
        "running = ScriptedProvider.start()\n"
        "print(running.process.pid, running.url, flush=True)\n"
        "time.sleep(600)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    parent = subprocess.Popen([sys.executable, "-c", parent_code], env=env, stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    pid, url = parent.stdout.readline().split()
    try:
        calls = f"{url.removesuffix('/v1')}/calls"
        assert httpx.get(calls, timeout=30, trust_env=False).json() == {"calls": []}
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
        assert wait_until(lambda: gone(int(pid)), timeout=30), "the provider outlived the process that started it"
        with pytest.raises(httpx.ConnectError):
            httpx.get(calls, timeout=30, trust_env=False)
    finally:
        parent.kill()
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()
        if not gone(int(pid)):  # the test failed: the orphan it left goes
            os.kill(int(pid), signal.SIGKILL)
