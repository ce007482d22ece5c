"""The loopback provider with the tests' script directives beside the shipped ``answer``, ``slow-<ms>`` and
``hang``: ``fail-<status>`` (an OpenAI error answer, 429 or 500 say), ``loop`` (call the first offered tool on
every turn, never answer), ``words-<n>`` (a final answer n words longer: ``w0 w1 ...``, streamed a word a
chunk). They run in the provider's thread, in the test's process: the crews' workers only name them."""

from __future__ import annotations

import re

from worker.completions import tool_call
from worker.provider import DIRECTIVES, Provider, Turn


def _fail(turn: Turn, match: re.Match[str]) -> None:
    turn.call.status = int(match.group(1))


def _loop(turn: Turn, match: re.Match[str]) -> None:
    turn.message = tool_call(turn.call, turn.body) or turn.message


def _words(turn: Turn, match: re.Match[str]) -> None:
    content = turn.message.get("content") or ""
    if "Final Answer:" in content:  # a tool call or a structured answer stays as it is
        turn.message["content"] = content + "".join(f" w{i}" for i in range(int(match.group(1))))


TEST_DIRECTIVES = {
    **DIRECTIVES,
    re.compile(r"fail-([45][0-9][0-9])$"): _fail,
    re.compile(r"loop$"): _loop,
    re.compile(r"words-([0-9]{1,6})$"): _words,
}


def scripted_provider() -> Provider:
    """A provider (not started) that knows the tests' directives too."""
    return Provider(directives=TEST_DIRECTIVES)
