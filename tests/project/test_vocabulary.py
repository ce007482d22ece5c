"""The contract's names are spelled once, in protocol/vocabulary.py: elsewhere they are used by reference."""

from __future__ import annotations

import ast
from pathlib import Path

from protocol import Operation, Reason
from tests.conftest import ROOT

HOME = ROOT / "protocol" / "vocabulary.py"
SOURCES = sorted(path for package in ("protocol", "supervisor", "worker") for path in (ROOT / package).rglob("*.py"))
# The same word naming something else: the CLI's ``run`` command (which starts any operation), a stop's reason
# (``StopReason.TIMEOUT``, which fails a job with ``Reason.TIMEOUT``), an HTTP client's option, a tool's method.
ELSEWHERE = {
    ROOT / "supervisor" / "console" / "commands.py": {"run"},
    ROOT / "supervisor" / "jobs" / "phases.py": {"timeout"},
    ROOT / "supervisor" / "testing.py": {"timeout"},
    ROOT / "worker" / "ledger.py": {"run"},
}


def spelled(path: Path, names: set[str]) -> list[str]:
    """Where a string literal in ``path`` is one of ``names``."""
    tree = ast.parse(path.read_text(), str(path))
    return [
        f"{path.name}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in names
    ]


def test_operations_and_reasons_are_spelled_only_in_the_vocabulary() -> None:
    names = {name.value for name in (*Operation, *Reason)}
    found = [where for path in SOURCES if path != HOME for where in spelled(path, names - ELSEWHERE.get(path, set()))]
    assert found == []


def test_the_check_sees_a_literal_in_any_place(tmp_path: Path) -> None:
    module = tmp_path / "runner.py"
    module.write_text('if job.operation == "train" or f(op="replay"):\n    pass\n')
    assert spelled(module, {"train", "replay", "run"}) == ["runner.py:1: 'train'", "runner.py:1: 'replay'"]


OURS = {"protocol", "supervisor", "worker", "tests"}


def imported_past_home(path: Path, homes: dict[str, set[str]]) -> list[str]:
    """Where ``path`` imports a name of the vocabulary from a module that is not one of its homes."""
    tree = ast.parse(path.read_text(), str(path))
    return [
        f"{path.name}:{node.lineno}: {alias.name} from {node.module}"
        for node in ast.walk(tree)
        # A relative import is ours too, and never a home: the house imports absolutely.
        if isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").split(".")[0] in OURS)
        for alias in node.names
        if alias.name in homes and node.module not in homes[alias.name]
    ]


def test_the_vocabulary_is_imported_from_its_home() -> None:
    """Not through a module that happens to import it: that module may stop, and the name's home is its meaning."""
    ours = {"Status", "TERMINAL_EVENTS", "Phase", "LIVE_PHASES", "STOPPABLE_PHASES"}
    homes = {name: {"supervisor.enums"} for name in ours}
    homes |= {name: {"protocol", "protocol.vocabulary"} for name in ("Operation", "READ_ONLY_OPERATIONS", "Reason")}
    others = sorted(path for folder in ("tests", "scripts") for path in (ROOT / folder).rglob("*.py"))
    assert [where for path in [*SOURCES, *others] for where in imported_past_home(path, homes)] == []


def test_the_import_check_sees_a_name_taken_through_another_module(tmp_path: Path) -> None:
    module = tmp_path / "relay.py"
    module.write_text(
        "from supervisor.jobs.phases import Phase, StopReason\nfrom .vocabulary import Status\n"
        "from supervisor.enums import Phase as Home\nfrom hypothesis import Phase as Theirs\n"
    )
    homes = {"Phase": {"supervisor.enums"}, "Status": {"supervisor.enums"}}
    assert imported_past_home(module, homes) == [
        "relay.py:1: Phase from supervisor.jobs.phases",
        "relay.py:2: Status from vocabulary",
    ]
