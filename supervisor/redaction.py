"""Secrets kept out of what a worker printed: the values of the worker's secret-looking environment
variables, and the bearer token, replaced before a stdout or stderr tail is shown or stored.

A provider's error often quotes the key it was given (``Incorrect API key provided: sk-…``); a tail is kept
in the journal and shown by the API, the CLI and the console, to people who need not hold that key.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

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
