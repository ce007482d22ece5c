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
REDACTED = "[redacted]"


def secrets_in(env: Mapping[str, str], more: Iterable[str | None] = ()) -> tuple[str, ...]:
    """The values to redact: of each variable named like a secret, and ``more``; longest first, so a
    secret that contains another is replaced whole."""
    values = {value for name, value in env.items() if name.upper().endswith(SECRET_SUFFIXES)}
    values.update(value for value in more if value)
    return tuple(sorted((v for v in values if len(v) >= MIN_SECRET_CHARS), key=len, reverse=True))


def redact(tail: str, secrets: Iterable[str]) -> str:
    """``tail`` (the last bytes of a stream) with each secret replaced, the end of one it begins inside too."""
    for secret in secrets:
        tail = tail.replace(secret, REDACTED)
        cut = next((cut for cut in range(1, len(secret) - 3) if tail.startswith(secret[cut:])), None)
        if cut is not None:
            tail = REDACTED + tail[len(secret) - cut :]
    return tail
