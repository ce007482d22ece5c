"""Logs: one JSON object per line (or plain text for people), never inputs, outputs or tokens.

The supervisor's own exceptions are reduced to their class. A crew's exception is logged whole, from its worker's
stderr, redacted as that is, unless ``LOG_CREW_TRACEBACKS`` is off: provider text may carry governed content.

The OpenTelemetry SDK's own lines (``SdkLines``) come as often as what they report, and from wherever it is: one of
each kind a minute is logged, and none carries a job's trace ids.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from typing import IO

import orjson

from supervisor.escaping import json_line, one_line

# What a record may carry beside its message (passed with ``extra=``); nothing else is emitted.
FIELDS = (
    "action_id",
    "crew_id",
    "operation",
    "outcome",
    "error_type",
    "reason",
    "duration_ms",
    "pid",
    "launcher",
    "signal",  # one the supervisor received, or the one that killed a worker
    "seconds",  # a drain's grace
    "running",  # jobs at a drain's start or end
    "queued",
    "phase",  # the one a job moved to
    "tokens",  # the LLM tokens a finished job spent
    "llm_calls",
    "traceback",  # a crew's exception, as its worker wrote it (LOG_CREW_TRACEBACKS)
    "descendants_killed",  # what a job's worker left running when it exited: how many, killed
    "leftovers",  # and each of them: pid, command (secrets masked), how it left
    "trace_id",  # the trace of the job the line is about, when it is traced (TraceFields)
    "span_id",  # that job's root span
    "held_back",  # lines like this one of the OpenTelemetry SDK's not logged since the last (SdkLines)
)
SDK_LOGGERS = "opentelemetry."  # the OpenTelemetry SDK's and its exporters' loggers
SDK_LINE_SECONDS = 60.0  # one line of each kind of theirs, at most, in this long
SDK_KINDS = 256  # kinds of line remembered (a message its SDK wrote with its values in: unbounded)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        document = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        document.update({name: getattr(record, name) for name in FIELDS if hasattr(record, name)})
        if record.exc_info and record.exc_info[0] is not None:
            document["exception"] = record.exc_info[0].__name__
        # Fields carry job-chosen text (action ids, error types): a raw U+2028 would split the line for readers.
        return json_line(orjson.dumps(document)).decode()


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        context = " ".join(f"{name}={_value(getattr(record, name))}" for name in FIELDS if hasattr(record, name))
        record = logging.makeLogRecord({**record.__dict__, "exc_info": None, "exc_text": None})
        # One line whatever job-chosen text it quotes: no newline, terminal escape or line separator.
        return one_line(f"{super().format(record)} {context}".rstrip())


def _value(value: object) -> str:
    """A field's value as logfmt writes it: quoted when it holds a space, ``=`` or ``"`` (or is empty), so
    that job-chosen text (an action id ``job7 outcome=completed``) cannot forge another field."""
    text = str(value)
    if text and not _NEEDS_QUOTES.search(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


_NEEDS_QUOTES = re.compile(r'[\s="\\]')


class SdkLines(logging.Filter):
    """The OpenTelemetry SDK's own lines, which come as often as what they report: a full export queue (at each span
    ended while it is full, in that span's job), a failed export (each batch, for as long as the collector is down).
    Of each kind (logger, level, message before its values) one is logged every ``every`` seconds; the next one
    logged says how many were not (``held_back``)."""

    def __init__(self, every: float = SDK_LINE_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.every, self._clock = every, clock
        self._last: dict[tuple[str, int, str], float] = {}  # when a line of each kind was last logged
        self._held: dict[tuple[str, int, str], int] = {}
        self._lock = threading.Lock()  # the SDK says them from its export thread too

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(SDK_LOGGERS):
            return True
        kind = (record.name, record.levelno, str(record.msg))
        now = self._clock()
        with self._lock:
            last = self._last.get(kind)
            if last is not None and now - last < self.every:
                self._held[kind] = self._held.get(kind, 0) + 1
                return False
            if len(self._last) >= SDK_KINDS:
                self._last.clear()
                self._held.clear()
            self._last[kind] = now
            if held := self._held.pop(kind, 0):
                record.held_back = held
        return True


class TraceFields(logging.Filter):
    """A line said within a traced job (``JobTrace.current``) carries its trace's ``trace_id`` and ``span_id``,
    from the current OpenTelemetry span; any other line, neither. Nor does the SDK's own: it says a line where it
    is (its export queue full at a job's span's end), not about that job."""

    def __init__(self) -> None:
        super().__init__()
        from opentelemetry import trace  # here: only serve's logs are configured, and every command imports this

        self._trace = trace

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith(SDK_LOGGERS):
            return True
        context = self._trace.get_current_span().get_span_context()
        if context.is_valid:
            record.trace_id = self._trace.format_trace_id(context.trace_id)
            record.span_id = self._trace.format_span_id(context.span_id)
        return True


def handler(style: str, stream: IO[str] | None = None) -> logging.Handler:
    """The supervisor's log handler: to ``stream`` (stderr by default), in ``style`` ("json" or "text")."""
    made = logging.StreamHandler(stream)
    made.setFormatter(JsonFormatter() if style == "json" else TextFormatter())
    made.addFilter(SdkLines())
    made.addFilter(TraceFields())
    return made


def configure(level: str, style: str) -> None:
    """The root handler serves uvicorn's loggers too (uvicorn is started with log_config=None)."""
    root = logging.getLogger()
    root.handlers[:] = [handler(style)]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
