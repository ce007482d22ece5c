"""An OpenAI-compatible chat-completions server on loopback: a provider for crews on CrewAI's own ``LLM``.

``LLM(model="openai/<script>", base_url=provider.url, api_key="...")`` reaches it through CrewAI's native
OpenAI provider, the ``openai`` SDK and httpx, exactly as a production crew reaches its provider: real HTTP,
nothing of CrewAI or the SDK replaced. The fork server warms that path against one of these
(``warmup.py``), and the tests, the bench and the demo serve their real-``LLM`` crews from one.

The model name is the script, directives joined by ``+``: ``answer`` (anything else: answer at once),
``slow-<ms>`` (answer after that long), ``hang`` (never answer: until the client hangs up or the server
stops); a ``Provider`` given more ``directives`` knows more (the tests' failures, tool loops and long
answers: ``tests/helpers/scripted_provider.py``). A request that offers tools and has no tool result yet gets
a call of its first tool; one with ``response_format`` gets JSON that fits the schema. Answers are derived
from the prompt, so the same crew gets the same answers in-process and through the sidecar, blocking
(``Content-Length``) or streamed (``stream: true``: SSE over chunked encoding, a tool call's arguments split
across chunks as real providers send them, with a usage chunk when ``stream_options.include_usage``).

Or they are scripted: ``script`` (or ``POST /scripts`` with ``{"model": ..., "replies": [...]}``) queues
replies, each ``{"content": text}``, ``{"tool_calls": [{"name": ..., "arguments": {...}}]}`` or ``{"status":
429, "message": ...}`` (an OpenAI error answer), that a model's next calls get in order (``"model": null``:
any model without a script of its own). Once a model's script is spent, its calls are answered 400, saying so.
``GET /calls`` gives the recorded calls (the most recent ``MAX_CALLS``, ``MAX_RECORDED_BYTES`` of requests);
``DELETE /scripts`` forgets every script and call (between tests).
``supervisor/llm_script.py`` is its client for the pytest plugin's ``crew_provider`` fixture.

Every request is recorded (``calls``), with when its client hung up if it did so before the answer was
whole; ``wait`` blocks until a condition on the calls holds. Standard library only: it imports in
milliseconds, and the fork server can stop it and be single-threaded again (``stop`` closes every
connection and joins every thread).

``python -m worker.provider [--port N]`` serves one until SIGTERM or SIGINT, printing its URL first; with
``--until-stdin-closes``, until its stdin ends too: a parent that holds the other end of that pipe takes the
provider with it when it dies, SIGKILLed included (``supervisor/llm_script.py``), so no provider is left serving
its recorded calls on loopback.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import http.server
import json
import os
import re
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from worker import completions

URL_ENV = "CREW_PROVIDER_URL"  # where the demo's and the tests' real-LLM crews find one (worker.demo.provider_llm)
DEFAULT_URL = "http://127.0.0.1:8091/v1"
MAX_BODY_BYTES = 16 * 1024 * 1024  # a request larger than this is answered 413 unread
MAX_SCRIPTED = 10_000  # replies queued for one model at once
MAX_SCRIPTED_MODELS = 1_000  # models with a script at once
# The recorded calls kept between two resets: the most recent, so that a provider nobody resets (the demo's, the
# bench's) answers for ever in bounded memory.
MAX_CALLS = 10_000
MAX_RECORDED_BYTES = 64 * 1024 * 1024  # of their requests' bodies, in all
SCRIPT_BODY = "a body with replies (a list) and model (a string, or null for any model) is required"
HOST = "127.0.0.1"


@dataclasses.dataclass
class Call:
    """One request as the provider saw it."""

    index: int
    model: str
    stream: bool
    messages: list[dict[str, Any]]
    tools: list[str]  # the offered functions' names
    started: float  # time.monotonic() when the request was read
    answered: float | None = None  # when the whole answer was written
    hung_up: float | None = None  # when the client closed the connection before that
    status: int = 200
    size: int = 0  # the request body's bytes


@dataclasses.dataclass
class Turn:
    """A call being answered, as its script's directives shape it: they may wait, change ``message``, or set
    ``call.status`` to answer an OpenAI error of that status instead."""

    call: Call
    body: dict[str, Any]  # the request
    message: dict[str, Any]  # the assistant's message to send
    wait: Callable[[float | None], None]  # seconds (None: for ever), cut short when the client hangs up
    error: str = ""  # the error answer's message, when ``call.status`` is not 200


Directive = Callable[[Turn, re.Match[str]], None]
DIRECTIVES: Mapping[re.Pattern[str], Directive] = {
    re.compile(r"hang$"): lambda turn, _: turn.wait(None),
    re.compile(r"slow-([0-9]{1,7})$"): lambda turn, match: turn.wait(int(match.group(1)) / 1000),
}


class Provider:
    """The server: ``start()`` it, point crews at ``url``, ``stop()`` it (or use it as a context manager).
    ``directives`` are the script's words it knows, each applied in turn to a call's ``Turn``."""

    def __init__(
        self, host: str = HOST, port: int = 0, directives: Mapping[re.Pattern[str], Directive] = DIRECTIVES
    ) -> None:
        self.directives = directives
        self._server = _Server((host, port), _Handler)
        self._host = host
        self._server.provider = self
        self._thread: threading.Thread | None = None
        self._changed = threading.Condition()
        self.calls: list[Call] = []  # the most recent (MAX_CALLS, MAX_RECORDED_BYTES)
        self._recorded = 0  # calls since the last reset, forgotten ones included: the next call's index
        self._recorded_bytes = 0  # of the requests in ``calls``
        self._scripts: dict[str | None, list[dict[str, Any]]] = {}  # model (None: any other) -> replies to give

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self._server.server_port}/v1"

    def start(self) -> Provider:
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="provider")
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, close every connection (a hanging call's included) and join every thread."""
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.close_connections()
        self._server.server_close()  # joins the connections' threads

    def __enter__(self) -> Provider:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait(self, condition: Callable[[list[Call]], bool], timeout: float) -> list[Call]:
        """The calls once ``condition(calls)`` holds; TimeoutError past ``timeout`` seconds."""
        with self._changed:
            if not self._changed.wait_for(lambda: condition(self.calls), timeout):
                raise TimeoutError(f"the provider's calls did not reach the condition in {timeout:.0f} s")
            return list(self.calls)

    def script(self, replies: list[Any], model: str | None = None) -> None:
        """Queue ``replies`` (see the module's doc) for ``model``'s next calls, after those already queued;
        ``model`` None: for every model without a script of its own. ValueError for a reply of no known form."""
        checked = [_checked(reply) for reply in replies]
        with self._changed:
            if model not in self._scripts and len(self._scripts) >= MAX_SCRIPTED_MODELS:
                raise ValueError(f"at most {MAX_SCRIPTED_MODELS} models have a script at once")
            queue = self._scripts.setdefault(model, [])
            if len(queue) + len(checked) > MAX_SCRIPTED:
                raise ValueError(f"a script holds at most {MAX_SCRIPTED} replies")
            queue.extend(checked)

    def reset(self) -> None:
        """Forget every script and every recorded call."""
        with self._changed:
            self._scripts.clear()
            self.calls.clear()
            self._recorded = self._recorded_bytes = 0
            self._changed.notify_all()

    def _play(self, turn: Turn) -> None:
        """Give ``turn`` its model's next scripted reply, if its model (or every model) has a script."""
        with self._changed:
            queue = self._scripts.get(turn.call.model, self._scripts.get(None))
            reply = queue.pop(0) if queue else None
        if queue is None:
            return
        if reply is None:
            turn.call.status = 400
            turn.error = f"the script of model {turn.call.model!r} has no reply left for this call"
        elif "status" in reply:
            turn.call.status, turn.error = reply["status"], reply["message"]
        elif "content" in reply:
            turn.message = {"role": "assistant", "content": reply["content"]}
        else:
            calls = [
                {
                    "id": f"call_{turn.call.index}_{number}",
                    "type": "function",
                    "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], separators=(",", ":"))},
                }
                for number, c in enumerate(reply["tool_calls"])
            ]
            turn.message = {"role": "assistant", "content": None, "tool_calls": calls}

    def _record(self, call: Call) -> None:
        with self._changed:
            call.index, self._recorded = self._recorded, self._recorded + 1
            self.calls.append(call)
            self._recorded_bytes += call.size
            while len(self.calls) > 1 and (
                len(self.calls) > MAX_CALLS or self._recorded_bytes > MAX_RECORDED_BYTES
            ):  # the oldest is forgotten
                self._recorded_bytes -= self.calls.pop(0).size
            self._changed.notify_all()

    def _update(self, call: Call, **changes: Any) -> None:
        with self._changed:
            for name, value in changes.items():
                setattr(call, name, value)
            self._changed.notify_all()


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = False  # joined by server_close: a stopped provider leaves no thread behind
    block_on_close = True
    provider: Provider

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.open: set[socket.socket] = set()
        self.lock = threading.Lock()
        self.closing = threading.Event()
        self.wake_read, self.wake_write = os.pipe()  # written once when closing: wakes every waiting call

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.lock:
            self.open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.lock:
            self.open.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        self.closing.set()
        os.write(self.wake_write, b"x")
        with self.lock:
            for connection in self.open:
                with contextlib.suppress(OSError):  # a handler waiting for its next request wakes
                    connection.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], OSError):  # a client that reset its connection is no error
            super().handle_error(request, client_address)

    def server_close(self) -> None:
        super().server_close()
        os.close(self.wake_read)
        os.close(self.wake_write)


class _HungUp(Exception):
    """The client closed the connection before the answer was whole."""


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as httpx uses it
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a test's output stays the test's

    def do_POST(self) -> None:
        route = self._route("/v1/chat/completions", "/scripts")
        if route is None:
            return
        needed = SCRIPT_BODY if route == "/scripts" else "a body with model and messages is required"
        length = self._length()
        if length is None:
            return
        body = self._read_json(length, needed)
        if body is None:
            return
        if route == "/scripts":
            self._script(body)
            return
        try:
            model, messages = str(body["model"]), list(body["messages"])
        except (KeyError, TypeError):
            self._send_json(400, completions.error_body("invalid_request_error", needed))
            return
        tools = [t.get("function", {}).get("name", "") for t in body.get("tools") or [] if isinstance(t, dict)]
        call = Call(0, model, bool(body.get("stream")), messages, tools, time.monotonic(), size=length)
        self.server.provider._record(call)
        try:
            self._answer(call, body)
        except _HungUp:
            self.close_connection = True
            self.server.provider._update(call, hung_up=time.monotonic())
        else:
            self.server.provider._update(call, answered=time.monotonic())

    def do_GET(self) -> None:
        if self._route("/calls") is None:
            return
        with self.server.provider._changed:
            calls = [dataclasses.asdict(call) for call in self.server.provider.calls]
        self._send_json(200, {"calls": calls})

    def do_DELETE(self) -> None:
        if self._route("/scripts") is None:
            return
        self.server.provider.reset()
        self._send_json(200, {"reset": True})

    def _route(self, *routes: str) -> str | None:
        """The request's route if it is one of ``routes``; else None, once it is answered 404."""
        route = self.path.partition("?")[0].rstrip("/")
        if route in routes:
            return route
        self._send_json(404, completions.error_body("not_found", f"no route {self.path}"))
        return None

    def _length(self) -> int | None:
        """The body's Content-Length; None once a bad or too large one is answered 400 or 413 (the connection
        then closes: where the next request would begin is unknown, the body being unread)."""
        given = (self.headers.get("Content-Length") or "0").strip()
        if not (given.isascii() and given.isdigit()):
            self.close_connection = True
            self._send_json(
                400, completions.error_body("invalid_request_error", f"Content-Length {given[:40]!r} is no byte count")
            )
            return None
        if len(given) > len(str(MAX_BODY_BYTES)) or int(given) > MAX_BODY_BYTES:
            self.close_connection = True
            self._send_json(413, completions.error_body("request_too_large", f"a body of {given[:40]} bytes"))
            return None
        return int(given)

    def _read_json(self, length: int, needed: str) -> Any:
        """The request's JSON object of ``length`` bytes, or None once it is answered 400 (saying what is
        ``needed``)."""
        try:
            body = json.loads(self.rfile.read(length))
        except ValueError:
            body = None
        if not isinstance(body, dict):
            self._send_json(400, completions.error_body("invalid_request_error", needed))
            return None
        return body

    def _script(self, body: dict[str, Any]) -> None:
        model, replies = body.get("model"), body.get("replies")
        try:
            if (model is not None and not isinstance(model, str)) or not isinstance(replies, list):
                raise ValueError(SCRIPT_BODY)
            self.server.provider.script(replies, model)
        except ValueError as e:
            self._send_json(400, completions.error_body("invalid_request_error", str(e)))
            return
        self._send_json(200, {"model": model, "queued": len(replies)})

    def _answer(self, call: Call, body: dict[str, Any]) -> None:
        turn = Turn(call, body, completions.reply(call, body), self._wait)
        self.server.provider._play(turn)
        for word in call.model.split("+"):
            for pattern, directive in self.server.provider.directives.items():
                if match := pattern.match(word):
                    directive(turn, match)
            if call.status != 200:
                message = turn.error or f"the provider answered {call.status}"
                self._send_json(call.status, completions.error_body("provider_error", message))
                return
        answer = turn.message
        usage = completions.usage(call.messages, answer)
        if not call.stream:
            choice = {"index": 0, "message": answer, "finish_reason": completions.finish(answer), "logprobs": None}
            self._send_json(
                200, {**completions.head(call, body, "chat.completion"), "choices": [choice], "usage": usage}
            )
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        head = completions.head(call, body, "chat.completion.chunk")
        for delta in completions.deltas(answer):
            self._event({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
        self._event({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": completions.finish(answer)}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            self._event({**head, "choices": [], "usage": usage})
        self._write(b"data: [DONE]\n\n")
        self._write(b"")  # the last chunk of the chunked encoding

    def _wait(self, seconds: float | None) -> None:
        """Wait ``seconds`` (None: for ever), or until the client hangs up (``_HungUp``) or we stop."""
        deadline = None if seconds is None else time.monotonic() + seconds
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return
            readable, _, _ = select.select([self.connection, self.server.wake_read], [], [], remaining)
            if self.server.closing.is_set():
                raise _HungUp  # stopping: the call ends unanswered
            if self.connection in readable and not _peek(self.connection):
                raise _HungUp

    def _event(self, data: dict[str, Any]) -> None:
        self._write(b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n")

    def _write(self, data: bytes) -> None:
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        except OSError:
            raise _HungUp from None

    def _send_json(self, status: int, data: dict[str, Any]) -> None:
        payload = json.dumps(data, separators=(",", ":")).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            self.wfile.flush()
        except OSError:
            raise _HungUp from None


def _checked(reply: Any) -> dict[str, Any]:
    """A scripted reply as ``_play`` reads it; ValueError naming what is wrong with one of no known form."""
    if isinstance(reply, dict) and isinstance(reply.get("content"), str) and len(reply) == 1:
        return reply
    if isinstance(reply, dict) and isinstance(reply.get("status"), int) and set(reply) <= {"status", "message"}:
        if not 400 <= reply["status"] <= 599:
            raise ValueError(f"a scripted error's status is 400 to 599, not {reply['status']}")
        return {"status": reply["status"], "message": str(reply.get("message") or f"scripted {reply['status']}")}
    calls = reply.get("tool_calls") if isinstance(reply, dict) and len(reply) == 1 else None
    if isinstance(calls, list) and calls and all(_is_tool_call(c) for c in calls):
        return {"tool_calls": [{"name": c["name"], "arguments": c.get("arguments") or {}} for c in calls]}
    raise ValueError(
        'a reply is {"content": text}, {"tool_calls": [{"name": ..., "arguments": {...}}, ...]} or '
        f'{{"status": 400..599, "message": text}}, not {json.dumps(reply)[:200]}'
    )


def _is_tool_call(call: Any) -> bool:
    return (
        isinstance(call, dict)
        and isinstance(call.get("name"), str)
        and isinstance(call.get("arguments", {}), dict)
        and set(call) <= {"name", "arguments"}
    )


def _peek(connection: socket.socket) -> bytes:
    """What waits to be read; b'' once the client has closed its side (or reset it)."""
    try:
        return connection.recv(1, socket.MSG_PEEK)
    except OSError:
        return b""


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m worker.provider", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default=HOST)
    parser.add_argument("--port", type=int, default=0, help="0: a free port (the URL printed says which)")
    parser.add_argument("--until-stdin-closes", action="store_true", help="stop too when stdin ends (its writer died)")
    args = parser.parse_args(argv)
    stopped = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopped.set())
    if args.until_stdin_closes:
        threading.Thread(target=_drain, args=(sys.stdin.fileno(), stopped), name="stdin", daemon=True).start()
    with Provider(args.host, args.port) as provider:
        print(provider.url, flush=True)
        stopped.wait()


def _drain(stdin: int, stopped: threading.Event) -> None:
    """Read ``stdin`` to its end (the last process holding its other end closed it, or died), then stop. Unbuffered:
    a thread still in ``sys.stdin.buffer`` at the exit would hold its lock, which aborts the interpreter."""
    while os.read(stdin, 4096):
        pass
    stopped.set()


if __name__ == "__main__":
    main(sys.argv[1:])
