"""Arrows run one way: supervisor -> protocol <- worker. Read from the source (every import statement,
function-level ones too), so a lazy import cannot slip past."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT

FORBIDDEN = {
    "supervisor": {"crewai", "worker"},  # the supervisor never loads CrewAI (170 MB, 5 s) nor the worker side
    "worker": {"supervisor"},
    "protocol": {"supervisor", "worker"},  # the pipe's vocabulary depends on neither end
}


def imported(path: Path) -> set[str]:
    """The top-level package of every absolute import in ``path``."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.partition(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_run_one_way(package: str) -> None:
    modules = sorted((ROOT / package).rglob("*.py"))
    assert modules
    wrong = {
        str(path.relative_to(ROOT)): sorted(imported(path) & FORBIDDEN[package])
        for path in modules
        if imported(path) & FORBIDDEN[package]
    }
    assert wrong == {}


def test_the_check_sees_a_lazy_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    import crewai.agent\n    from worker import job\n")
    assert imported(module) == {"crewai", "worker"}
