"""What a worker process finds when it starts: its pipes on fixed fds, and CrewAI told to stay offline.

The supervisor's launchers and the fork server put the pipes there; the worker reads them there. Both
sides take the numbers from here, so they cannot drift apart.
"""

from __future__ import annotations

CONTROL_FD = 3  # supervisor -> worker (Start, Stop); for the fork server, its socket
EVENT_FD = 4  # worker -> supervisor: every frame the worker sends

# The supervisor's settings: the few a worker reads come in its environment under this prefix, and the worker
# takes them out of its environment first (worker.lifecycle.take_settings), so no job's code sees any.
SETTINGS_PREFIX = "AIP_CREWAI_"

# "uid:gid" a worker (or the fork server) switches to before anything else, when the supervisor's
# AIP_CREWAI_WORKER_USER is set; absent, it keeps the supervisor's uid.
WORKER_IDS = "AIP_CREWAI_WORKER_IDS"

# When jobs are sandboxed (worker/landlock.py), JSON lists of paths: what no worker process may read, and what the
# workers may change (each job then only its own places, its Start's ``writable``).
SANDBOX_HIDDEN = "AIP_CREWAI_SANDBOX_HIDDEN"
SANDBOX_WRITABLE = "AIP_CREWAI_SANDBOX_WRITABLE"

# The job's event bounds, which the worker keeps its chunk events within (worker/chunks.py).
MAX_EVENTS = SETTINGS_PREFIX + "MAX_EVENTS_PER_RUN"
MAX_EVENT_BYTES = SETTINGS_PREFIX + "MAX_EVENT_BYTES"

# CrewAI calls home (and stalls ~20 s offline) unless these are set before it is imported.
QUIET_CREWAI = {
    "CREWAI_DISABLE_TELEMETRY": "true",
    "OTEL_SDK_DISABLED": "true",
    "CREWAI_TRACING_ENABLED": "false",
    "CREWAI_DISABLE_VERSION_CHECK": "true",
}
