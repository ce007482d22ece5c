"""The generic top-level names: ``supervisor``, ``worker`` and ``protocol`` must be this installation's.

PyPI's supervisord installs a package named ``supervisor`` too, and other projects own ``worker`` or
``protocol``: in a shared environment one distribution's files overwrite or shadow the other's. Only
the standard library is used here, so the check runs even when ``protocol`` is someone else's.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from pathlib import Path

from supervisor.doctor.findings import Finding, ok, problem

PACKAGES = ("supervisor", "worker", "protocol")
DISTRIBUTION = "crew-supervisor"
HOME = Path(__file__).resolve().parents[2]  # holds this supervisor package, and worker and protocol beside it
FIX = (
    "install crew-supervisor into a virtual environment of its own (python -m venv), with nothing else that"
    " installs supervisor, worker or protocol, and no other copy of them on PYTHONPATH"
)


def check() -> list[Finding]:
    found = [_resolved(name) for name in PACKAGES]
    found += [_shared(distribution) for distribution in importlib.metadata.distributions()]
    problems = [finding for finding in found if finding is not None]
    return problems or [ok("names", f"{', '.join(PACKAGES)} are this installation's ({HOME})")]


def shadowed() -> bool:
    """Whether importing one of our packages would load another's (only the path is looked at: fast)."""
    return any(_resolved(name) is not None for name in PACKAGES)


def _resolved(name: str) -> Finding | None:
    """A problem if importing ``name`` would load anything but the package beside this one."""
    spec = importlib.util.find_spec(name)
    places = [Path(place).resolve() for place in (spec.submodule_search_locations or ())] if spec else []
    if places == [HOME / name]:
        return None
    where = ", ".join(map(str, places)) or (spec.origin if spec and spec.origin else "nothing")
    return problem("names", f"the package {name} resolves to {where}, not to {HOME / name}", FIX)


def _shared(distribution: importlib.metadata.Distribution) -> Finding | None:
    """A problem if another distribution installs a top-level package (or module) of one of our names."""
    name = distribution.metadata["Name"] or ""
    if re.sub(r"[-_.]+", "-", name).lower() == DISTRIBUTION:
        return None
    tops = {file.parts[0].removesuffix(".py") for file in distribution.files or ()}
    shared = sorted(tops & set(PACKAGES))
    if not shared:
        return None
    return problem("names", f"the distribution {name} {distribution.version} also installs {', '.join(shared)}", FIX)
