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


# Inside supervisor/: which subpackages each may import. Lower layers never reach up: process control and
# the journal know nothing of jobs, jobs nothing of HTTP, and the operator CLI (an HTTP client) only the
# journal's event names; chaos only the console's way to a supervisor; the doctor what serve checks with,
# never HTTP. (The journal names the pipes' Tail for typing only.)
LAYERS = {
    "processes": set(),
    "journal": {"processes"},
    "jobs": {"journal", "processes"},
    "http": {"jobs", "journal", "processes"},
    "console": {"journal"},
    "chaos": {"console"},  # a client of the HTTP API (the CLI's target and token) and of the processes it sees
    "doctor": {"jobs", "journal", "processes"},
}


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_supervisor_layers_import_downwards(layer: str) -> None:
    reached = set()
    for path in (ROOT / "supervisor" / layer).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("supervisor."):
                reached.add(node.module.split(".")[1])  # type: ignore[union-attr]
    assert reached & set(LAYERS) - {layer} <= LAYERS[layer]


def test_every_layer_says_what_it_holds() -> None:
    for layer in LAYERS:
        docstring = ast.get_docstring(ast.parse((ROOT / "supervisor" / layer / "__init__.py").read_text()))
        assert docstring and "\n" not in docstring
