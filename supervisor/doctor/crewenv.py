"""The crews' env files (``CREW_ENV_DIR``): each served crew's ``<crew_id>.env`` read as a job's start reads it
(``jobs/environment.py``'s ``read_crew_env``: its refusals of mode, owner and size, and its parser, which names a
bad line by its number and never quotes it), and, beyond what a job refuses, one that group or others can read: it
holds a key. What a usable file sets is what the crew is built with (``workers.py``), as its jobs get it."""

from __future__ import annotations

import dataclasses
import os
import shlex
import stat

from supervisor.config import PREFIX, Settings
from supervisor.doctor.findings import Finding, ok, problem
from supervisor.jobs.environment import CrewEnvError, read_crew_env


@dataclasses.dataclass
class CrewFiles:
    usable: dict[str, dict[str, str]]  # crew id -> its file's variables
    broken: set[str]  # crews whose every job fails with crew_env_invalid
    findings: list[Finding]


def read(settings: Settings, crews: list[str]) -> CrewFiles:
    found = CrewFiles({}, set(), [])
    if not settings.crew_env_dir:
        return found
    for crew_id in crews:
        path = os.path.join(settings.crew_env_dir, crew_id + ".env")
        try:
            variables = read_crew_env(settings.crew_env_dir, crew_id)
        except CrewEnvError as exc:
            fix = f"fix that file (owned by us or root, 0600, NAME=VALUE lines): every job of {crew_id!r} fails"
            found.findings.append(problem("crew env", str(exc), f"{fix} with crew_env_invalid until then"))
            found.broken.add(crew_id)
            continue
        if not os.path.lexists(path):
            continue
        found.usable[crew_id] = variables
        if (mode := stat.S_IMODE(os.stat(path).st_mode)) & 0o044:
            detail = f"{path}: mode {mode:04o}: group or others can read it, and the key it holds"
            found.findings.append(problem("crew env", detail, f"chmod 600 {shlex.quote(path)}"))
    if not found.findings:
        names = ", ".join(found.usable) or "none"
        detail = f"{PREFIX}CREW_ENV_DIR={settings.crew_env_dir}: the files of {len(found.usable)} crews ({names})"
        found.findings.append(ok("crew env", f"{detail} read as a job reads them, 0600 or stricter"))
    return found
