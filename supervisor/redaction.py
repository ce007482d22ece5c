"""Secrets kept out of what a worker wrote: the values of the worker's secret-looking environment variables, of its
crew's file, and the bearer token, replaced before a stdout or stderr tail, an event or an output is shown or stored
(a tail never longer than the text it redacts: ``redact_within``).

A provider's error often quotes the key it was given (``Incorrect API key provided: sk-…``), and a tool's answer
may too; a tail, an event and an output are kept in the journal and shown by the API, the CLI and the console, to
people who need not hold that key.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

SECRET_SUFFIXES = ("_KEY", "_TOKEN", "_SECRET", "_PASSWORD")
# Shorter values ("1", "true", a region) would redact ordinary words, and are no secret worth the name.
MIN_SECRET_CHARS = 8
# The least of a secret cut by a tail's ends that is still replaced: shorter is too likely ordinary text.
MIN_FRAGMENT_CHARS = 6
REDACTED = "[redacted]"


def secrets_in(env: Mapping[str, str], more: Iterable[str | None] = ()) -> tuple[str, ...]:
    """The values to redact: of each variable named like a secret, and ``more``; longest first, so a
    secret that contains another is replaced whole."""
    values = {value for name, value in env.items() if name.upper().endswith(SECRET_SUFFIXES)}
    values.update(value for value in more if value)
    return tuple(sorted((v for v in values if len(v) >= MIN_SECRET_CHARS), key=len, reverse=True))


def holding(env: Mapping[str, str], secrets: Iterable[str]) -> list[str]:
    """The names of ``env``'s variables that hold one of ``secrets``: what a job's worker is told, never a value (it
    has these in its environment; the token, kept out of that, must not reach it)."""
    kept = set(secrets)
    return sorted(name for name, value in env.items() if value in kept)


def redact(text: str, secrets: Iterable[str], *, cut_start: bool = False, cut_end: bool = False) -> str:
    """``text`` with each secret replaced; with ``cut_start`` (a tail that lost its beginning) or ``cut_end``
    (a stream still being written, or cut by a kill) also the part of one that text begins or ends inside."""
    for secret in secrets:
        text = text.replace(secret, REDACTED)
        if cut_start and (length := _suffix_at_start(text, secret)):
            text = REDACTED + text[length:]
        if cut_end and (length := _prefix_at_end(text, secret)):
            text = text[:-length] + REDACTED
    return text


def redact_within(
    text: str, secrets: Iterable[str], limit: int, *, cut_start: bool = False, cut_end: bool = False
) -> str:
    """``redact``, in at most ``limit`` characters. A marker is longer than a secret or fragment of fewer than ten
    characters, so a redacted text can outgrow the text it redacts (a stored tail then had more characters than its
    stream had bytes, which the journal's consistency rule refuses): its beginning makes room, as a tail's does,
    whole markers at a time, then any end of a secret the new beginning falls inside. Every step only drops
    characters from the start, so no whole secret, and no secret's beginning at its end, can come back."""
    secrets = tuple(secrets)
    text = redact(text, secrets, cut_start=cut_start, cut_end=cut_end)
    if len(text) <= limit:
        return text
    at = len(text) - limit
    split = text.find(REDACTED, max(at - len(REDACTED) + 1, 0))  # a marker the cut would leave in pieces
    if -1 < split < at:
        at = split + len(REDACTED)
    text = text[at:]
    while length := max((_suffix_at_start(text, secret) for secret in secrets), default=0):
        text = text[length:]
    return text


def _suffix_at_start(text: str, secret: str) -> int:
    """The length of the longest proper end of ``secret`` that ``text`` begins with (0: none long enough)."""
    head = text[:MIN_FRAGMENT_CHARS]
    if len(head) < MIN_FRAGMENT_CHARS:
        return 0
    at = secret.find(head, 1)  # only where the text's first characters occur: a few places, not every one
    while at != -1:
        if text.startswith(secret[at:]):
            return len(secret) - at
        at = secret.find(head, at + 1)
    return 0


def _prefix_at_end(text: str, secret: str) -> int:
    """The length of the longest proper beginning of ``secret`` that ``text`` ends with (0: none long enough)."""
    tail = text[-MIN_FRAGMENT_CHARS:]
    if len(tail) < MIN_FRAGMENT_CHARS:
        return 0
    at = secret.rfind(tail, 0, len(secret) - 1)
    while at != -1:
        if text.endswith(secret[: at + MIN_FRAGMENT_CHARS]):
            return at + MIN_FRAGMENT_CHARS
        at = secret.rfind(tail, 0, at + MIN_FRAGMENT_CHARS - 1)
    return 0


def mentions(encoded: bytes, secrets: tuple[str, ...]) -> bool:
    """Whether a value's compact JSON (orjson's) may hold a secret: every string of it (a dict's keys included)
    holding one holds its JSON-escaped form (escaping is character by character), so False is sure; True may be
    wrong (an escape's letters before a secret), which only costs ``redact_data`` a walk that finds nothing."""
    return any(form in encoded for form in _escaped(secrets))


@functools.lru_cache(maxsize=64)  # a job's secrets are one tuple: escaped once, not at each of its events
def _escaped(secrets: tuple[str, ...]) -> tuple[bytes, ...]:
    return tuple(orjson.dumps(secret)[1:-1] for secret in secrets)


def redact_data(value: Any, secrets: tuple[str, ...]) -> Any:
    """A decoded JSON value with each secret replaced in each of its strings, a dict's keys included: its dicts
    and lists changed in place (a string is returned replaced). Numbers, booleans and null are kept as they are,
    as is the structure, but for two keys of one dict that differ only by a secret, which become one. Walked
    without recursion: a worker's JSON may be nested deeper than Python's recursion limit."""
    if isinstance(value, str):
        return redact(value, secrets)
    pending = [value] if isinstance(value, dict | list) else []
    while pending:
        container = pending.pop()
        if isinstance(container, list):
            for index, item in enumerate(container):
                if isinstance(item, str):
                    container[index] = redact(item, secrets)
                elif isinstance(item, dict | list):
                    pending.append(item)
            continue
        renamed = False
        for key, item in container.items():
            if isinstance(item, str):
                container[key] = redact(item, secrets)
            elif isinstance(item, dict | list):
                pending.append(item)
            renamed = renamed or (isinstance(key, str) and redact(key, secrets) != key)
        if renamed:  # rebuilt in its order
            items = list(container.items())
            container.clear()
            container.update((redact(key, secrets) if isinstance(key, str) else key, item) for key, item in items)
    return value
