"""What a check finds: one line each, ``ok``, ``warning`` or ``problem`` (with its fix)."""

from __future__ import annotations

import dataclasses
import enum

import orjson

from supervisor.escaping import json_line, visible


class Verdict(enum.StrEnum):
    """What a check says of what it checked: its line's first word, its JSON's ``status``."""

    OK = "ok"
    WARNING = "warning"
    PROBLEM = "problem"


OK, WARNING, PROBLEM = Verdict
BLOCKING = ("names", "settings", "runtime")  # a problem here stops the checks that need it


@dataclasses.dataclass(frozen=True)
class Finding:
    check: str
    status: Verdict
    detail: str
    fix: str = ""


def ok(check: str, detail: str) -> Finding:
    return Finding(check, OK, detail)


def warning(check: str, detail: str, fix: str) -> Finding:
    return Finding(check, WARNING, detail, fix)


def problem(check: str, detail: str, fix: str) -> Finding:
    return Finding(check, PROBLEM, detail, fix)


def live_doctor(host: str, port: int) -> str:
    """The command that checks the supervisor serving at ``host:port`` (a wildcard address: on loopback)."""
    where = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"crew-supervisor doctor --url http://{f'[{where}]' if ':' in where else where}:{port}"


def report(findings: list[Finding], as_json: bool, serving: bool = False) -> str:
    """What the doctor prints: its findings as a JSON list, or a line each and the verdict (``serving``: of a
    running supervisor, ``--url``)."""
    return json_line(orjson.dumps([vars(f) for f in findings])).decode() if as_json else _text(findings, serving)


def _text(findings: list[Finding], serving: bool) -> str:
    lines = [
        f"{f.status:<8} {f.check:<11} {visible(f.detail)}" + (f"; fix: {visible(f.fix)}" if f.fix else "")
        for f in findings
    ]
    counts = {status: sum(f.status == status for f in findings) for status in (PROBLEM, WARNING)}
    said = [f"{n} {status}{'s' if n > 1 else ''}" for status, n in counts.items() if n]
    verdict = ("serving" if serving else "ready to serve") if not counts[PROBLEM] else "not ready"
    lines.append(f"doctor: {verdict}" + (f" ({', '.join(said)})" if said else f" (every check {OK})"))
    blocked = next((f.check for f in findings if f.status == PROBLEM and f.check in BLOCKING), None)
    if blocked is not None:
        lines.append(f"doctor: the checks that need the {blocked} did not run: fix it, then run the doctor again")
    return "\n".join(lines)
