"""``crew-supervisor doctor --url URL``: a running deployment checked through its API (``/health``), with the token
the operator commands use (``console/client.py``). Reads only."""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from typing import Any

from supervisor.config import PREFIX
from supervisor.console.client import Client, OperatorError, Target
from supervisor.doctor.findings import Finding, ok, problem, warning
from supervisor.enums import Readiness
from supervisor.escaping import visible

NEAR_FULL = 0.9  # of MAX_RETAINED_RUNS: a warning before every start answers 507
REACH_FIX = (
    "give the URL it serves on (--url) and its token (--token, --token-file, or"
    f" {PREFIX}BEARER_TOKEN or {PREFIX}BEARER_TOKEN_FILE), as the operator commands take them"
)


def check(target: Target) -> list[Finding]:
    """Its ``/health``, read once: reachable, ready, durable, its crews, a job's sandbox, its capacity."""
    try:
        with Client(target) as client:
            health = client.get("/health")
    except OperatorError as exc:
        return [problem("api", str(exc), REACH_FIX)]
    if not isinstance(health, dict) or not {"status", "crews", "retained_runs"} <= set(health):
        detail = f"{target.url}/health answered, but not with a crew-supervisor's health (a JSON object)"
        return [problem("api", detail, "give the supervisor's own URL, not a proxy's or another service's")]
    found = [ok("api", f"{target.url} answers: instance {health.get('instance')}, launcher {health.get('launcher')}")]
    try:
        checked = [_status(health), _journal(health), _crews(health), _sandbox(health), _capacity(health)]
        return [*found, *checked, *_tracing(health)]
    except (AttributeError, KeyError, TypeError, ValueError) as exc:  # a field of another shape: one line, no traceback
        detail = f"{target.url}/health answered, but not with a crew-supervisor's health ({visible(exc)})"
        return [problem("api", detail, "give the supervisor's own URL, not a proxy's or another service's")]


def _status(health: Mapping[str, Any]) -> Finding:
    if health["status"] == Readiness.READY:
        return ok("status", f"ready: it starts jobs ({health.get('active_runs')} active)")
    detail = f"{health['status']}: it starts no new job (a SIGTERM came: it finishes its jobs, then stops)"
    return problem("status", detail, "start it again once it stopped, or wait for the one that replaces it")


def _journal(health: Mapping[str, Any]) -> Finding:
    if health.get("durable_journal"):
        return ok("journal", "durable: a file (STATE_FILE), its jobs kept across restarts")
    detail = f"ephemeral ({PREFIX}ALLOW_EPHEMERAL): its jobs are lost at every stop"
    return warning("journal", detail, f"serve with {PREFIX}STATE_FILE on a volume")


def _crews(health: Mapping[str, Any]) -> Finding:
    crews, operations = health.get("crews") or [], ", ".join(health.get("operations") or [])
    if not crews:
        return problem("crews", "it serves no crew", f"give it a registry with crews ({PREFIX}REGISTRY)")
    return ok("crews", f"{len(crews)} served ({', '.join(crews)}); operations: {operations}")


def _sandbox(health: Mapping[str, Any]) -> Finding:
    sandbox = health.get("sandbox") or {}
    layers, missing = ", ".join(sandbox.get("layers") or []), ", ".join(sandbox.get("missing") or [])
    if sandbox.get("mode") == "off":
        detail = "off: each job reaches all its uid may (other crews' files, the journal, other jobs' processes)"
        return warning("sandbox", detail, f"serve with {PREFIX}WORKER_SANDBOX=auto")
    if missing:
        fix = "a kernel with Landlock ABI 6 (Linux 6.12) in its lsm= list, on x86_64"
        return warning("sandbox", f"{layers or 'no layer'}; this kernel gives a job no {missing}", fix)
    return ok("sandbox", f"{layers}: every layer")


def _capacity(health: Mapping[str, Any]) -> Finding:
    """Retained against MAX_RETAINED_RUNS, and the retention window when ``/health`` says it (``retention``)."""
    retained, limit = _count(health, "retained_runs", required=True), _count(health, "max_retained_runs")
    retention = health.get("retention") if isinstance(health.get("retention"), dict) else None
    detail = f"{retained} of {limit} job records ({PREFIX}MAX_RETAINED_RUNS)" + _retention(retention)
    archivable = _count(retention, "archivable") if retention is not None else 0
    fix = f"archive finished jobs (crew-supervisor archive), or raise {PREFIX}MAX_RETAINED_RUNS"
    if limit and retained >= limit and not archivable:
        return problem("capacity", f"{detail}: every start answers 507", fix)
    if limit and retained >= NEAR_FULL * limit:
        return warning("capacity", f"{detail}: near full", fix)
    return ok("capacity", detail)


def _tracing(health: Mapping[str, Any]) -> list[Finding]:
    """Whether its jobs are traced, and where a job's record links to (no line from a supervisor older than
    traces, whose ``/health`` says nothing of them)."""
    tracing = health.get("tracing")
    if not isinstance(tracing, dict):
        return []
    exporter, page = tracing.get("exporter"), tracing.get("trace_ui_url")
    detail = f"each job traced, sent over {exporter}" if exporter else "off: no job is traced"
    linked = f"; a job's record links to {page}" if page else f"; no trace UI ({PREFIX}TRACE_UI_URL)"
    return [ok("tracing", detail + (linked if exporter else ""))]


def _count(fields: Mapping[str, Any], name: str, required: bool = False) -> int:
    """A count ``/health`` gives (0 if it gives none, unless ``required``); ValueError naming it for anything else."""
    value = fields.get(name)
    if value is None and not required:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"its {name} is {json.dumps(value)[:40]}, not a count")
    return value


def _retention(retention: Mapping[str, Any] | None) -> str:
    if retention is None:
        return ""
    window = retention.get("archive_after_seconds")
    said = [f"archived after {window} s" if window else "no archive window"]
    oldest = retention.get("oldest_retained_at")
    if oldest is not None:
        when = oldest
        if isinstance(oldest, int | float):
            when = datetime.datetime.fromtimestamp(oldest, datetime.UTC).isoformat(timespec="seconds")
        said.append(f"oldest from {when}")
    said.append(f"{retention.get('archivable', 0)} archivable now")
    return "; " + ", ".join(said)
