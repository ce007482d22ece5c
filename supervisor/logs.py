"""Logs: one JSON object per line (or plain text for people), never inputs, outputs or tokens.

The supervisor's own exceptions are reduced to their class. A crew's exception is logged whole, from its worker's
stderr, redacted as that is, unless ``LOG_CREW_TRACEBACKS`` is off: provider text may carry governed content.
"""

from __future__ import annotations

import logging
import re
import time

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
)


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


class TraceFields(logging.Filter):
    """A line said within a traced job (``JobTrace.current``) carries its trace's ``trace_id`` and ``span_id``,
    from the current OpenTelemetry span; any other line, neither."""

    def __init__(self) -> None:
        super().__init__()
        from opentelemetry import trace  # here: only serve's logs are configured, and every command imports this

        self._trace = trace

    def filter(self, record: logging.LogRecord) -> bool:
        context = self._trace.get_current_span().get_span_context()
        if context.is_valid:
            record.trace_id = self._trace.format_trace_id(context.trace_id)
            record.span_id = self._trace.format_span_id(context.span_id)
        return True


def configure(level: str, style: str) -> None:
    """The root handler serves uvicorn's loggers too (uvicorn is started with log_config=None)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if style == "json" else TextFormatter())
    handler.addFilter(TraceFields())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
