"""Whether a worker of the workers' user (``WORKER_USER``) can import what it needs: the standard library, this
environment's packages, crew-supervisor and the registry's module.

A worker starts as root and takes that uid before it imports the registry (worker/tether.py), so a Python
that user cannot reach (one under a 0700 ``/root``, as pyenv's) fails only at the worker's first import
after the change ("No module named 'sqlite3'"), which names no cause. So serve and the doctor first run the
interpreter as a worker runs: started as root, it takes that uid, gid and no supplementary groups, then imports.
When that fails, each place on the way the user may not pass is found by its mode, and the first is named,
with its owner and mode and the chmod that opens it.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import stat
import subprocess
import sys
from collections.abc import Mapping
from importlib.util import find_spec
from pathlib import PurePosixPath

from supervisor.config import PREFIX, ConfigError, Settings

PROBE_SECONDS = 60.0  # 50-90 ms here (an interpreter's start and a few imports): a minute is a hang
SEARCH, READ = 0o1, 0o4  # a mode's bits for one class
MAX_LINKS = 40  # the kernel's bound on the links one lookup follows
# What a worker imports after it took the uid, by where it comes from: the probe imports each as that user.
NEEDED = {
    "sqlite3": "the standard library",  # not imported at a worker's start: read after the change, as CrewAI is
    "_sqlite3": "the standard library",  # an extension module: lib-dynload, a directory of its own
    "orjson": "this environment's packages",
    "protocol": "crew-supervisor",
    "worker": "crew-supervisor",
}
# The uid change is a worker's (lifecycle.confine): no groups, then the gid, then the uid, real, effective and
# saved. What the interpreter read at start it read as root, as a worker's did (site's scan of the path among
# it). Then the registry's top-level module (argv[1]) is found without running it, and its file read.
PROBE = (
    "import os, sys; uid, gid = map(int, sys.argv[2:4]); os.setgroups([]); os.setresgid(gid, gid, gid);"
    f" os.setresuid(uid, uid, uid); import {', '.join(NEEDED)}; from importlib.util import find_spec;"
    " spec = find_spec(sys.argv[1]) if sys.argv[1] else None;"
    " spec and spec.has_location and open(spec.origin, 'rb').close(); print(spec and spec.origin or '')"
)


@dataclasses.dataclass(frozen=True)
class Denied:
    """A place on the way that the workers' user may not pass: ``bits`` (SEARCH, READ) are what it needs."""

    path: str
    info: os.stat_result
    bits: int

    def said(self) -> str:
        verb = ("traverse" if self.bits == SEARCH else "list") if stat.S_ISDIR(self.info.st_mode) else "read"
        owner = f"{self.info.st_uid}:{self.info.st_gid}"
        return f"it may not {verb} {self.path} (owner {owner}, mode {stat.S_IMODE(self.info.st_mode):04o})"


def check(settings: Settings, env: Mapping[str, str], executable: str = sys.executable) -> None:
    """Raise ConfigError, naming the cause and its fix, unless a worker of ``executable`` with the workers'
    ``env`` imports ``NEEDED`` and finds the registry's module (where we find it) once it took the workers'
    uid. Without ``WORKER_USER`` the workers run as we do: nothing to check."""
    if settings.worker_ids is None:
        return
    module = settings.registry.partition(":")[0].partition(".")[0]
    failure = _probe(settings.worker_ids, env, executable, module)
    if failure is None:
        return
    uid, gid = settings.worker_ids
    who = f"{PREFIX}WORKER_USER={settings.worker_user!r} (uid {uid}, gid {gid})"
    elsewhere = f"put Python and the packages where uid {uid} can read them, or set {PREFIX}WORKER_USER to one who can"
    found = [(what, _walk(path, settings.worker_ids, bits)) for what, path, bits in _needs(module)]
    denied = _merged(found)
    if not denied:  # an ACL, a security module or a broken install: what the interpreter said is all we know
        detail = f"workers as {who} cannot run {executable} and import what they need: {failure}"
        raise ConfigError(detail, f"make Python and the packages readable by uid {uid}, or {elsewhere}")
    what, first = next((what, each[0]) for what, each in found if each)
    detail = f"workers as {who} cannot import {what}: {first.said()}"
    raise ConfigError(detail, f"{_chmod(denied, settings.worker_ids)}, or {elsewhere}")


def _probe(ids: tuple[int, int], env: Mapping[str, str], executable: str, module: str) -> str | None:
    """Run the probe; what went wrong, or None."""
    # -B: it writes no bytecode as that user; -s: no user site-packages, as a worker (SpawnLauncher).
    command = [executable, "-B", "-s", "-c", PROBE, module, *map(str, ids)]
    try:
        done = subprocess.run(
            command,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=PROBE_SECONDS,
        )
    except subprocess.TimeoutExpired:
        return f"no answer within {PROBE_SECONDS:.0f} s"
    except OSError as exc:
        return str(exc)
    if done.returncode != 0:
        return (done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"])[0]
    if not done.stdout.strip() and _origin(module):  # we find it, that user does not
        return f"No module named {module!r}"
    return None


def _needs(module: str) -> list[tuple[str, str, int]]:
    """(what, path, bits) for each place a worker needs once it took the uid, in the order it meets them: each
    module's file to read, and a package's directory to list (its submodules are found there). The directories
    on the path were listed at start, as root."""
    needs = []
    for name, where in [*NEEDED.items(), (module, "the registry's module")]:
        origin = _origin(name)
        if not origin:
            continue
        path = PurePosixPath(origin)
        what = f"{name} ({where}, {path})"
        needs.append((what, str(path), READ))
        if path.name == "__init__.py":
            needs.append((what, str(path.parent), READ | SEARCH))
    return needs


def _origin(module: str) -> str:
    """The file we import ``module`` from, found without running it; empty if none (or built in)."""
    try:
        spec = find_spec(module) if module else None
    except (ImportError, ValueError):
        return ""
    return spec.origin if spec is not None and spec.has_location and spec.origin else ""


def _walk(path: str, ids: tuple[int, int], bits: int) -> list[Denied]:
    """What ``ids`` (with no supplementary group) may not pass on the way to ``path``, links followed as the
    kernel follows them: search on each directory entered, ``bits`` on ``path`` itself."""
    denied: list[Denied] = []
    here = "/"
    todo = list(reversed(PurePosixPath(path).parts[1:]))
    links = 0
    try:
        while todo:
            info = os.stat(here)
            if not grants(info, ids, SEARCH) and here not in {d.path for d in denied}:
                denied.append(Denied(here, info, SEARCH))
            name = todo.pop()
            step = os.path.join(here, name)
            if name == "..":
                here = os.path.dirname(here)
            elif stat.S_ISLNK(os.lstat(step).st_mode) and links < MAX_LINKS:
                links += 1
                target = PurePosixPath(os.readlink(step))
                here = "/" if target.is_absolute() else here
                todo += reversed(target.parts[1:] if target.is_absolute() else target.parts)
            else:
                here = step
        info = os.stat(here)
    except OSError:  # gone, or never there: not what stops the user
        return denied
    if not grants(info, ids, bits):
        denied.append(Denied(here, info, bits))
    return denied


def grants(info: os.stat_result, ids: tuple[int, int], bits: int) -> bool:
    """Whether the mode's owner, group or other class (the one that applies to ``ids``, a process without
    supplementary groups) holds ``bits``. ACLs are not read."""
    shift = 6 if info.st_uid == ids[0] else 3 if info.st_gid == ids[1] else 0
    return (info.st_mode >> shift) & bits == bits


def _merged(found: list[tuple[str, list[Denied]]]) -> list[Denied]:
    """Each place once, with every bit the needs that pass it ask of it."""
    merged: dict[str, Denied] = {}
    for _, each in found:
        for d in each:
            had = merged.get(d.path)
            merged[d.path] = d if had is None else dataclasses.replace(had, bits=had.bits | d.bits)
    return list(merged.values())


def _chmod(denied: list[Denied], ids: tuple[int, int]) -> str:
    """One chmod per class and bits (``o+x``, ``o+rx``), each naming its places: in the class that applies to
    the workers' user (its group's where the place is its group's, rather than everyone's)."""
    commands: dict[str, list[str]] = {}
    for d in denied:
        who = "u" if d.info.st_uid == ids[0] else "g" if d.info.st_gid == ids[1] else "o"
        letters = ("r" if d.bits & READ else "") + ("x" if d.bits & SEARCH else "")
        commands.setdefault(f"{who}+{letters}", []).append(shlex.quote(d.path))
    return " && ".join(f"chmod {spec} {' '.join(paths)}" for spec, paths in commands.items())
