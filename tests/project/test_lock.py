"""The lock files agree with pyproject.toml (scripts/lockfile.py), checked offline: CI fails when someone changes
pyproject's dependency tables without running scripts/lock. Each check is shown failing on a broken copy."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))  # scripts/ is not a package
import lockfile


def test_the_lock_files_agree_with_pyproject() -> None:
    problems = lockfile.problems(ROOT)
    assert not problems, "\n".join(problems)


def test_the_dev_lock_has_the_extras_and_the_tools_and_the_image_lock_has_neither() -> None:
    dev = {pin.name for pin in lockfile.pins(ROOT / lockfile.DEV_LOCK)}
    runtime = {pin.name for pin in lockfile.pins(ROOT / lockfile.RUNTIME_LOCK)}
    assert {"crewai", "pytest", "schemathesis", "matplotlib", "setuptools", "uv"} <= dev
    assert "crewai" in runtime
    assert not {"pytest", "schemathesis", "matplotlib", "setuptools"} & runtime


def test_a_pin_with_a_marker_is_read_with_it(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    lock.write_text(
        "# comment\nNumPy==2.4.6 ; python_full_version < '3.12' \\\n    --hash=sha256:aa \\\n    --hash=sha256:bb\n"
        "    # via crewai\nrich>=13\n"
    )
    assert lockfile.pins(lock) == [
        lockfile.Pin("numpy", "2.4.6", 'python_full_version < "3.12"', ("sha256:aa", "sha256:bb")),
        lockfile.Pin("rich", "", "", ()),
    ]


def locked(name: str) -> str:
    """The version the dev lock pins ``name`` to, so the cases below survive a refresh."""
    (pin,) = [pin for pin in lockfile.pins(ROOT / lockfile.DEV_LOCK) if pin.name == name]
    return pin.version


NEW_LINE = '    "rich>=13,<15",\n'
# name: (file edited, a regular expression matching exactly once, its replacement, a part of each problem expected)
BROKEN = {
    "a new dependency, not locked": (
        "pyproject.toml",
        re.escape(NEW_LINE),
        NEW_LINE + '    "tomlkit>=0.13",\n',
        ["requirements.lock: made from other", "requirements-dev.lock: made from other", "tomlkit>=0.13 is not locked"],
    ),
    "a new dependency the lock happens to hold: only the stamp sees it": (
        "pyproject.toml",
        re.escape(NEW_LINE),
        NEW_LINE + '    "numpy>=2",\n',
        ["requirements.lock: made from other", "requirements-dev.lock: made from other"],
    ),
    "a bound the pin falls outside": (
        "pyproject.toml",
        '"crewai>=1.15.5,<1.16"',
        '"crewai>=1.16,<1.17"',
        [
            "requirements.lock: made from other",
            "requirements-dev.lock: made from other",
            f"requirements.lock: crewai=={locked('crewai')} is outside crewai<1.17,>=1.16",
            f"requirements-dev.lock: crewai=={locked('crewai')} is outside crewai<1.17,>=1.16",
        ],
    ),
    "a test extra the dev lock does not satisfy": (
        "pyproject.toml",
        '"pytest>=8,<10"',
        '"pytest>=10"',
        [
            "requirements.lock: made from other",
            "requirements-dev.lock: made from other",
            f"requirements-dev.lock: pytest=={locked('pytest')} is outside pytest>=10",
        ],
    ),
    "another Python": (
        "pyproject.toml",
        'requires-python = ">=3.11,<3.14"',
        'requires-python = ">=3.12,<3.14"',
        ["requirements.lock: made from other", "requirements-dev.lock: made from other"],
    ),
    "a pin without its hashes": (
        lockfile.RUNTIME_LOCK,
        r"(?m)^(crewai==\S+)(?: \\\n +--hash=\S+)+",
        r"\1",
        [f"requirements.lock: crewai=={locked('crewai')} has no sha256 hash"],
    ),
    "an image lock that leaves the dev lock's pins": (
        lockfile.RUNTIME_LOCK,
        r"(?m)^crewai==\S+",
        "crewai==1.15.6",
        ["requirements.lock: crewai==1.15.6 is not in requirements-dev.lock"],
    ),
    "a dev lock with an unpinned uv": (
        lockfile.DEV_LOCK,
        r"(?m)^uv==\S+",
        "uv>=0.1",
        [
            "requirements-dev.lock: uv is not pinned to one version",
            f"requirements.lock: uv=={locked('uv')} is not in requirements-dev.lock",  # crewai-cli needs it too
        ],
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_copy_fails(tmp_path: Path, case: str) -> None:
    for name in ("pyproject.toml", lockfile.RUNTIME_LOCK, lockfile.DEV_LOCK):
        shutil.copy(ROOT / name, tmp_path / name)
    # Each case counts only what its edit adds, so a stale lock in the tree fails the test above, not all of these.
    for lock in (lockfile.RUNTIME_LOCK, lockfile.DEV_LOCK):
        lockfile.write_stamp(tmp_path / lock, lockfile.stamp(tmp_path / "pyproject.toml"))
    before = set(lockfile.problems(tmp_path))
    name, pattern, replacement, expected = BROKEN[case]
    text, count = re.subn(pattern, replacement, (tmp_path / name).read_text())
    assert count == 1, f"{name}: {pattern!r} matched {count} times: update the case"
    (tmp_path / name).write_text(text)
    found = [problem for problem in lockfile.problems(tmp_path) if problem not in before]
    missing = [part for part in expected if not any(part in problem for problem in found)]
    unexpected = [problem for problem in found if not any(part in problem for part in expected)]
    assert (missing, unexpected) == ([], [])
