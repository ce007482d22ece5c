"""Which kernel limits hold a job here: a pids and a memory cgroup per job, or sampling; the rlimits; and where
the jobs' traces would go."""

from __future__ import annotations

import resource
import urllib.parse
from collections.abc import Mapping

from supervisor import listener
from supervisor.config import PREFIX, Settings
from supervisor.doctor.findings import Finding, live_doctor, ok, problem, warning
from supervisor.jobs.sandbox import Sandbox
from supervisor.jobs.tracing import Tracing, TracingError, sdk_disabled
from supervisor.processes.limits import CPU_BACKSTOP_SECONDS, Limits

MiB = 1024 * 1024


def listen(settings: Settings) -> Finding:
    """Whether ``serve`` could take its address: bound as it binds, then let go at once."""
    where = f"{settings.host}:{settings.port}"
    try:
        listener.bind(settings.host, settings.port).close()
    except listener.ListenError as exc:
        fix = f"stop what listens there (another supervisor?), or set {PREFIX}PORT (or {PREFIX}HOST)"
        fix += f"; to check a supervisor that serves there: {live_doctor(settings.host, settings.port)}"
        return problem("listen", str(exc), fix)
    return ok("listen", f"{where} is free")


def cgroups(settings: Settings) -> Finding:
    """Found as ``serve`` finds them (``Limits``), and removed again: the probe leaves no cgroup behind."""
    limits = Limits(settings)
    try:
        held = limits.health()
    finally:
        limits.stop()
    detail = f"process_limit: {held['process_limit']}, memory_limit: {held['memory_limit']} (as /health says)"
    caps = {"process_limit": "WORKER_MAX_PROCESSES", "memory_limit": "WORKER_MAX_MEMORY_MB"}
    sampled = [PREFIX + setting for key, setting in caps.items() if held[key] == "sampled"]
    if not sampled:
        return ok("cgroups", f"{detail}: the kernel refuses a job's fork past its cap, and stops it at its memory cap")
    fix = (
        f"set {PREFIX}CGROUPS=auto"
        if settings.cgroups == "off"
        else "run the supervisor where it can write a pids and a memory cgroup (cgroup v1, or a delegated v2"
        " subtree such as a container's own), or cap the whole container (--pids-limit, --memory)"
    )
    meaning = (
        f"{' and '.join(sampled)} only sampled every {settings.limit_sample_ms} ms: a fork bomb or a fast"
        " memory hog can pass its cap between two samples"
    )
    return warning("cgroups", f"{detail}; {meaning}", fix)


def sandbox(settings: Settings, offered: list[str]) -> Finding:
    """A job's sandbox, as ``/health`` and the start-up log say it: ``offered`` is the check worker's word on which
    layers its kernel has."""
    held = Sandbox(settings, offered)
    if held.mode == "off":
        detail = "off: each job reaches all its uid may (other crews' files, the journal, other jobs' processes)"
        return warning("sandbox", detail, f"set {PREFIX}WORKER_SANDBOX=auto")
    layers = ", ".join(held.layers) or "no layer"
    if held.missing:
        return (problem if held.mode == "enforce" else warning)("sandbox", f"{layers}; {held.shortfall()}", held.fix())
    return ok(
        "sandbox",
        f"{layers}: a job reads all but the state, the token, the crews' env files and the training directory,"
        " changes only its own places, and cannot trace, read or signal a process outside it",
    )


def containment(settings: Settings, contained: bool) -> Finding:
    """What holds every process of a job, as ``/health`` says it: ``contained`` is the check worker's word that
    it denies itself cgroup writes (Landlock), as every worker does."""
    limits = Limits(settings)
    try:
        limits.contained = contained
        held = limits.containment()
    finally:
        limits.stop()
    if held == "cgroup":
        return ok(
            "containment",
            "cgroup: every process a job starts stays in its cgroups (no worker can write a cgroup"
            " file), and is killed when the job ends or at the next start after a crash",
        )
    if held.startswith("cgroup"):
        return warning(
            "containment",
            f"{held}: a job's process that owns a cgroup file (uid 0 owns the root cgroups') can leave its cgroups,"
            " its caps and its kill",
            f"a kernel with Landlock (5.13 or later, with landlock in its lsm= list), or a {PREFIX}WORKER_USER",
        )
    return warning(
        "containment",
        f"{held}: no cgroup per job, so a process that leaves the job's group between two samples outlives the job",
        f"set {PREFIX}CGROUPS=auto"
        if settings.cgroups == "off"
        else "run the supervisor where it can write a pids"
        " cgroup (cgroup v1, or a delegated v2 subtree such as a container's own)",
    )


def rlimits(settings: Settings) -> Finding:
    """What each worker process sets on itself at its start (with or without ``WORKER_USER``): the setting, or this
    environment's hard limit if lower (a limit is only lowered)."""
    parts = [
        _rlimit("RLIMIT_NOFILE", resource.RLIMIT_NOFILE, settings.worker_max_open_files, "WORKER_MAX_OPEN_FILES"),
        _rlimit(
            "RLIMIT_AS", resource.RLIMIT_AS, settings.worker_max_address_space_mb * MiB, "WORKER_MAX_ADDRESS_SPACE_MB"
        ),
        _rlimit("RLIMIT_FSIZE", resource.RLIMIT_FSIZE, settings.worker_max_disk_mb * MiB, "WORKER_MAX_DISK_MB"),
    ]
    if settings.worker_max_cpu_seconds:
        parts.append(f"RLIMIT_CPU {CPU_BACKSTOP_SECONDS} s past {PREFIX}WORKER_MAX_CPU_SECONDS, behind the sampler")
    return ok("rlimits", "per worker: " + "; ".join(parts))


def llm_budget(settings: Settings) -> Finding:
    """What a job may spend on LLM calls before it is stopped, as ``/health`` says it (``llm_budget``)."""
    limits = [
        f"{value} {what} ({PREFIX}{setting})" if value else f"{what} unbounded ({PREFIX}{setting}=0)"
        for value, what, setting in (
            (settings.worker_max_tokens, "tokens", "WORKER_MAX_TOKENS"),
            (settings.worker_max_llm_calls, "LLM calls", "WORKER_MAX_LLM_CALLS"),
        )
    ]
    detail = "per job: " + ", ".join(limits) + "; a crew's registry entry may ask for less"
    return ok("llm budget", detail)


def tracing(environ: Mapping[str, str]) -> Finding:
    """Where ``serve`` would send the jobs' traces, as the ``OTEL_*`` variables say (``Tracing.from_environ``: its
    exporter made, then closed at once; nothing is sent): off, or the exporter and the endpoint's host, never the
    rest of its URL nor the exporter's headers (either may hold a vendor's key)."""
    try:
        tracer = Tracing.from_environ(environ)
    except TracingError as exc:
        return problem(
            "tracing", str(exc), "fix that OTEL_* variable, or unset OTEL_EXPORTER_OTLP_ENDPOINT (no traces)"
        )
    tracer.close()
    endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")
    if tracer.exporter is not None:
        return ok("tracing", f"each job traced, sent over {tracer.exporter} to {_host(endpoint)}")
    if endpoint.strip() and sdk_disabled(environ):  # CrewAI's docs say to set it: here it is the supervisor's
        return warning(
            "tracing",
            f"off: OTEL_SDK_DISABLED=true turns the supervisor's tracing off, though an endpoint ({_host(endpoint)})"
            " is set",
            "unset OTEL_SDK_DISABLED (every worker sets it true for itself, CrewAI's telemetry off), or the endpoint",
        )
    detail = "off: no job is traced (no OTEL_EXPORTER_OTLP_ENDPOINT, or OTEL_SDK_DISABLED or OTEL_TRACES_EXPORTER)"
    return ok("tracing", detail)


def _host(endpoint: str) -> str:
    """An endpoint's host and port alone (gRPC's may come without a scheme)."""
    parts = urllib.parse.urlsplit(endpoint if "//" in endpoint else f"//{endpoint}")
    host = parts.hostname or "?"
    try:
        port = parts.port
    except ValueError:  # not a number: said as no port
        port = None
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{port}" if port is not None else host


def _rlimit(name: str, kind: int, value: int, setting: str) -> str:
    if not value:
        return f"{name} off ({PREFIX}{setting}=0)"
    hard = resource.getrlimit(kind)[1]
    if hard != resource.RLIM_INFINITY and hard < value:
        return f"{name} {hard} (this environment's hard limit, below {PREFIX}{setting})"
    return f"{name} {value}"
