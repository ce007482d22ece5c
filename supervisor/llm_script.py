"""Scripted model answers for testing crews offline: the replies to script, and the scripted provider that gives them.

    crew_provider.script(tool_call("tide_times", {"port": "Brest"}), answer("High tide at Brest: 06:12."))

The provider is the loopback OpenAI-compatible server of ``worker/provider.py``, run as a process of its own
(``python -m worker.provider``: the supervisor side never imports the worker's) and scripted over HTTP, so
that a crew reaches it the same way from a job's worker and from the test's own process: a crew whose
``LLM(model="openai/...", base_url=<url>, api_key=...)`` points at ``url`` gets the scripted replies in the
order its calls come, streamed (a job's ``run``) or not, and every call is recorded for the test to read.
The pytest plugin's ``crew_provider`` fixture gives one, its URL in ``CREW_PROVIDER_URL``.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

import httpx

from supervisor.testing import SOURCE

URL_ENV = "CREW_PROVIDER_URL"  # where crews under test find the provider (worker.provider.URL_ENV)
START_SECONDS = 30.0
STOP_SECONDS = 10.0


def answer(text: str) -> dict[str, Any]:
    """A reply with the model's text: a final answer (or whatever the crew asked it for)."""
    return {"content": text}


def tool_call(name: str, arguments: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A reply calling the crew's tool ``name`` with ``arguments`` (CrewAI runs it and calls the model again)."""
    return {"tool_calls": [{"name": name, "arguments": dict(arguments or {})}]}


def error(status: int, message: str = "") -> dict[str, Any]:
    """A reply that is an OpenAI error answer of ``status`` (400 to 599). The openai SDK retries 408, 409, 429
    and 5xx twice by default, each retry a call of its own: script as many, or give the LLM ``max_retries=0``."""
    return {"status": status, "message": message or f"scripted error {status}"}


class ScriptedProviderError(RuntimeError):
    """The provider did not start, or refused a script (the message says why)."""


class ScriptedProvider:
    """A running scripted provider: ``url`` for the crews' ``base_url``, ``script`` replies, read ``calls``."""

    def __init__(self, process: subprocess.Popen[bytes], url: str) -> None:
        self.process = process
        self.url = url  # the OpenAI base URL, ending in /v1
        self._http = httpx.Client(base_url=url.removesuffix("/v1"), timeout=30, trust_env=False)

    @classmethod
    def start(cls, python: str = sys.executable, timeout: float = START_SECONDS) -> ScriptedProvider:
        """``python -m worker.provider`` on a free loopback port, once it has said its URL."""
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SOURCE), os.environ.get("PYTHONPATH")]))}
        # Its stdin is a pipe only this process writes: ended when it dies, however it dies, which stops the provider.
        command = [python, "-m", "worker.provider", "--port", "0", "--until-stdin-closes"]
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stdin=subprocess.PIPE)
        assert process.stdout is not None
        readable, _, _ = select.select([process.stdout], [], [], timeout)
        line = process.stdout.readline().decode().strip() if readable else ""
        if not line.startswith("http://"):
            _end(process)
            raise ScriptedProviderError(f"the scripted provider did not start within {timeout:.0f} s: {line!r}")
        return cls(process, line)

    def script(self, *replies: Mapping[str, Any], model: str | None = None) -> None:
        """Queue ``replies`` (``answer``, ``tool_call``, ``error``) for the next calls of ``model`` (the name
        the crew's LLM sends: ``gpt-4o-mini`` for ``openai/gpt-4o-mini``), after those already queued; ``model``
        None: of every model without a script of its own. Once they are spent, a call is answered 400."""
        response = self._http.post("/scripts", json={"model": model, "replies": list(replies)})
        if response.status_code != 200:
            raise ScriptedProviderError(response.json()["error"]["message"])

    def calls(self, model: str | None = None) -> list[dict[str, Any]]:
        """The calls so far (of ``model`` only, if given), in order: each with ``model``, ``stream``,
        ``messages`` (what the crew sent: a tool's result is a ``{"role": "tool", ...}`` message), ``tools``
        (the names of the tools offered) and ``status`` (the answer's HTTP status)."""
        calls = self._http.get("/calls").raise_for_status().json()["calls"]
        return [call for call in calls if model is None or call["model"] == model]

    def reset(self) -> None:
        """Forget every script and call (the ``crew_provider`` fixture does it before each test)."""
        self._http.delete("/scripts").raise_for_status()

    def stop(self) -> None:
        self._http.close()
        _end(self.process)


def _end(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the provider closes its connections and exits), SIGKILL if it outlasts ``STOP_SECONDS``."""
    process.terminate()
    try:
        process.wait(STOP_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    for pipe in (process.stdout, process.stdin):
        if pipe is not None:
            pipe.close()
