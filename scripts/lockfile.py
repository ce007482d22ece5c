"""The lock files against pyproject.toml: the stamp scripts/lock writes into them, and every way they can disagree.

requirements-dev.lock is what .venv runs (scripts/venv.sh): its dependencies, test, bench and docs extras, the
build backend (the editable install and the project's wheel are built with it) and uv (which installs the rest).
requirements.lock is what the image runs (scripts/wheelhouse): the dependencies alone, resolved within the dev lock's
pins. Each starts with a stamp of pyproject's dependency tables, so an edit of those tables without a refresh is
caught offline (tests/project/test_lock.py), even one that the pinned versions happen to satisfy.

usage: scripts/lockfile.py dev-inputs   # what requirements-dev.lock locks besides pyproject's tables (scripts/lock)
       scripts/lockfile.py stamp        # write the stamp line at the top of both lock files (scripts/lock)
       scripts/lockfile.py check        # print every disagreement; exit 1 if there is one
"""

from __future__ import annotations

import hashlib
import json
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
RUNTIME_LOCK = "requirements.lock"
DEV_LOCK = "requirements-dev.lock"
DEV_EXTRAS = ("test", "bench", "docs")
INSTALLER = "uv"  # pip installs it from the dev lock's own entry, then it installs the rest (scripts/venv.sh)
STAMP = "# pyproject.toml's dependency tables, sha256:"
REFRESH = "run scripts/lock"


@dataclass(frozen=True)
class Pin:
    """One locked requirement: ``name==version ; marker`` and its hashes."""

    name: str  # canonical
    version: str  # "" when the line is not ``==`` one version
    marker: str  # "" where it applies everywhere
    hashes: tuple[str, ...]


def tables(pyproject: Path) -> dict[str, Any]:
    """The parts of pyproject.toml a lock is made from (and nothing else: its comments and layout do not count)."""
    data = tomllib.loads(pyproject.read_text())
    project = data["project"]
    return {
        "requires-python": project.get("requires-python", ""),
        "dependencies": project.get("dependencies", []),
        "optional-dependencies": project.get("optional-dependencies", {}),
        "build-system.requires": data.get("build-system", {}).get("requires", []),
    }


def stamp(pyproject: Path) -> str:
    canonical = json.dumps(tables(pyproject), sort_keys=True, separators=(",", ":"))
    return f"{STAMP} {hashlib.sha256(canonical.encode()).hexdigest()}"


def dev_inputs(pyproject: Path) -> list[str]:
    return [*tables(pyproject)["build-system.requires"], INSTALLER]


def runtime_requirements(pyproject: Path) -> list[Requirement]:
    return [Requirement(text) for text in tables(pyproject)["dependencies"]]


def dev_requirements(pyproject: Path) -> list[Requirement]:
    extras = tables(pyproject)["optional-dependencies"]
    texts = [text for extra in DEV_EXTRAS for text in extras[extra]]
    return runtime_requirements(pyproject) + [Requirement(text) for text in texts + dev_inputs(pyproject)]


def pins(lock: Path) -> list[Pin]:
    """Every requirement line of a pip requirements file (continuation lines joined), in order."""
    found = []
    for line in lock.read_text().replace("\\\n", " ").splitlines():
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        spec, *hashes = text.split(" --hash=")
        try:
            requirement = Requirement(spec.strip())
        except InvalidRequirement as error:
            raise ValueError(f"{lock.name}: not a requirement: {spec.strip()!r} ({error})") from None
        exact = [s.version for s in requirement.specifier if s.operator == "=="]
        version = exact[0] if len(exact) == 1 and len(requirement.specifier) == 1 else ""
        marker = str(requirement.marker) if requirement.marker else ""
        found.append(Pin(canonicalize_name(requirement.name), version, marker, tuple(h.strip() for h in hashes)))
    return found


def lock_problems(lock: Path, wanted: list[Requirement], expected_stamp: str) -> list[str]:
    """What is wrong with one lock: its stamp, unpinned or unhashed lines, requirements it misses or contradicts."""
    problems = []
    first = lock.read_text().partition("\n")[0]
    if first != expected_stamp:
        problems.append(f"{lock.name}: made from other dependency tables than pyproject.toml's now: {REFRESH}")
    locked = pins(lock)
    for pin in locked:
        if not pin.version:
            problems.append(f"{lock.name}: {pin.name} is not pinned to one version")
        if not any(h.startswith("sha256:") for h in pin.hashes):
            problems.append(f"{lock.name}: {pin.name}=={pin.version} has no sha256 hash")
    by_name: dict[str, list[Pin]] = {}
    for pin in locked:
        by_name.setdefault(pin.name, []).append(pin)
    for requirement in wanted:
        candidates = by_name.get(canonicalize_name(requirement.name), [])
        if not candidates:
            problems.append(f"{lock.name}: {requirement} is not locked: {REFRESH}")
        for pin in candidates:
            if pin.version and not requirement.specifier.contains(pin.version, prereleases=True):
                problems.append(f"{lock.name}: {pin.name}=={pin.version} is outside {requirement}: {REFRESH}")
    return problems


def problems(root: Path) -> list[str]:
    """Every disagreement between ``root``'s pyproject.toml and its two locks, and between the locks; [] if none."""
    pyproject, runtime_lock, dev_lock = root / "pyproject.toml", root / RUNTIME_LOCK, root / DEV_LOCK
    expected = stamp(pyproject)
    found = lock_problems(runtime_lock, runtime_requirements(pyproject), expected)
    found += lock_problems(dev_lock, dev_requirements(pyproject), expected)
    dev_pins = {(pin.name, pin.version, pin.marker) for pin in pins(dev_lock)}
    for pin in pins(runtime_lock):
        # A dev pin with no marker applies everywhere, so it covers the runtime's pin of a narrower marker too.
        if not {(pin.name, pin.version, pin.marker), (pin.name, pin.version, "")} & dev_pins:
            where = f" ; {pin.marker}" if pin.marker else ""
            found.append(f"{runtime_lock.name}: {pin.name}=={pin.version}{where} is not in {dev_lock.name}: {REFRESH}")
    return found


def write_stamp(lock: Path, line: str) -> None:
    text = lock.read_text()
    if text.startswith(STAMP):
        text = text.partition("\n")[2]
    lock.write_text(f"{line}\n{text}")


def main(argv: list[str]) -> int:
    pyproject = ROOT / "pyproject.toml"
    command = argv[0] if len(argv) == 1 else ""
    if command == "dev-inputs":
        print("\n".join(dev_inputs(pyproject)))
    elif command == "stamp":
        for name in (RUNTIME_LOCK, DEV_LOCK):
            write_stamp(ROOT / name, stamp(pyproject))
    elif command == "check":
        found = problems(ROOT)
        print("\n".join(found or ["the lock files agree with pyproject.toml"]))
        return 1 if found else 0
    else:
        print(__doc__[__doc__.index("usage:") :], end="", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
