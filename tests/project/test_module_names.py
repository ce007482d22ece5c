"""A module's name means one thing: two modules share a name only as the ends of one thing (issue 59)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from tests.conftest import ROOT

# Each shared name, with the one thing its modules are the ends of.
ENDS_OF_ONE_THING = {
    "backup.py": "the journal's online copy: the command's flags and words, and the copy",
    "environment.py": "a worker's environment: its contract, and a job's built by the supervisor",
    "forkserver.py": "the fork server: its process, and the supervisor's handle on it",
    "ledger.py": "a job's effect ledger: the worker says it, the supervisor takes it, the journal keeps it",
    "places.py": "a job's places on disk: the worker moves CrewAI into them, the supervisor measures them",
    "resume.py": "a resume: the worker continues a run, the console asks for one, chaos checks one",
    "stacks.py": "a job's stacks: the worker answers DumpStacks, the supervisor asks and keeps",
    "tracing.py": "a job's trace: the worker says its spans, the supervisor exports them",
}


def shared_names(root: Path) -> dict[str, list[str]]:
    """Each module name found more than once under protocol/, worker/ and supervisor/, with its paths."""
    paths: dict[str, list[str]] = defaultdict(list)
    for package in ("protocol", "worker", "supervisor"):
        for path in sorted((root / package).rglob("*.py")):
            if path.name not in ("__init__.py", "__main__.py"):
                paths[path.name].append(str(path.relative_to(root)))
    return {name: found for name, found in paths.items() if len(found) > 1}


def test_a_module_name_means_one_thing() -> None:
    assert set(shared_names(ROOT)) <= set(ENDS_OF_ONE_THING)


def test_the_check_sees_a_name_taken_twice(tmp_path: Path) -> None:
    for path in ("protocol/a.py", "worker/run.py", "supervisor/chaos/run.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    assert shared_names(tmp_path) == {"run.py": ["worker/run.py", "supervisor/chaos/run.py"]}
