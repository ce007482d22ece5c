"""What a check finds: one line each, ``ok``, ``warning`` or ``problem`` (with its fix)."""

from __future__ import annotations

import dataclasses

OK, WARNING, PROBLEM = "ok", "warning", "problem"


@dataclasses.dataclass(frozen=True)
class Finding:
    check: str
    status: str
    detail: str
    fix: str = ""


def ok(check: str, detail: str) -> Finding:
    return Finding(check, OK, detail)


def warning(check: str, detail: str, fix: str) -> Finding:
    return Finding(check, WARNING, detail, fix)


def problem(check: str, detail: str, fix: str) -> Finding:
    return Finding(check, PROBLEM, detail, fix)
