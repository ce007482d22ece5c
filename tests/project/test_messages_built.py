"""Every protocol message the supervisor and the worker build is given each field it requires: no type checker runs
on this tree, and a ``Failed`` built without its ``reason`` in a rarely taken branch raised ``TypeError`` there."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import protocol
from protocol.messages import Message
from tests.conftest import ROOT

SOURCES = sorted(path for package in ("supervisor", "worker") for path in (ROOT / package).rglob("*.py"))
MESSAGES = {
    name: cls
    for name, cls in vars(protocol).items()
    if isinstance(cls, type) and issubclass(cls, Message) and cls is not Message
}


def required(cls: type[Message]) -> list[str]:
    missing = dataclasses.MISSING
    return [f.name for f in dataclasses.fields(cls) if f.default is missing and f.default_factory is missing]


def short_of_fields(path: Path, root: Path = ROOT) -> list[str]:
    """Each call in ``path`` of a message class by its name that leaves a required field out (a call with ``*`` or
    ``**`` is taken as whole)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in MESSAGES):
            continue
        if any(isinstance(arg, ast.Starred) for arg in node.args) or any(kw.arg is None for kw in node.keywords):
            continue
        fields = required(MESSAGES[node.func.id])
        given = set(fields[: len(node.args)]) | {kw.arg for kw in node.keywords}
        if missing := [name for name in fields if name not in given]:
            found.append(f"{path.relative_to(root)}:{node.lineno}: {node.func.id} without {', '.join(missing)}")
    return found


def test_every_message_built_has_its_required_fields() -> None:
    assert [problem for path in SOURCES for problem in short_of_fields(path)] == []


def test_the_check_sees_a_field_left_out(tmp_path: Path) -> None:
    module = tmp_path / "forkserver.py"
    module.write_text('Failed(error_type="x", message="m", uncertain_outcome=False)\nHello(1)\nStart(*given)\n')
    problems = [problem.split(": ", 1)[1] for problem in short_of_fields(module, tmp_path)]
    assert problems == ["Failed without reason"]
