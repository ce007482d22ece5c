"""A job's secrets masked in what its worker cuts before it sends (a ledger entry's names, a span's strings), as the
supervisor masks them (supervisor/redaction.py): a secret cut in two would pass the supervisor's mask."""

from __future__ import annotations

from collections.abc import Iterable

REDACTED = "[redacted]"  # the supervisor's word for a secret


def ordered(secrets: Iterable[str]) -> tuple[str, ...]:
    """The secrets to mask, longest first, as the supervisor masks: a secret that holds another is replaced whole."""
    return tuple(sorted({secret for secret in secrets if secret}, key=len, reverse=True))


def masked(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` with each of ``secrets`` (``ordered``) replaced."""
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return text
