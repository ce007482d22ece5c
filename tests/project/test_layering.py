"""Arrows run one way: supervisor -> protocol <- worker. Read from the source (every import statement,
function-level ones too), so a lazy import cannot slip past."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
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
# journal's event names; chaos only the console's way to a supervisor; the doctor what serve checks with, and for
# ``--url`` the console's way to a supervisor. (The journal names the pipes' Tail for typing only.)
LAYERS = {
    "processes": set(),
    "journal": {"processes"},
    "jobs": {"journal", "processes"},
    "http": {"jobs", "journal"},  # and of those only what FACADE allows
    "console": {"journal"},
    "chaos": {"console"},  # a client of the HTTP API (the CLI's target and token) and of the processes it sees
    "doctor": {"jobs", "journal", "processes", "console"},
}


def layers_reached(path: Path, package: tuple[str, ...]) -> set[str]:
    """The ``supervisor`` subpackages ``path`` (a module of ``package``, e.g. ``("supervisor", "jobs")``)
    imports, in every form: ``from supervisor.x import y``, ``import supervisor.x``, ``from supervisor import
    x``, and a relative ``from ..x import y``."""
    reached = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            modules = [f"{module}.{alias.name}" for alias in node.names] if module == "supervisor" else [module]
        else:
            continue
        reached.update(
            parts[1] for parts in (m.split(".") for m in modules) if parts[0] == "supervisor" and len(parts) > 1
        )
    return reached


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_supervisor_layers_import_downwards(layer: str) -> None:
    paths = (ROOT / "supervisor" / layer).rglob("*.py")
    reached = set().union(*(layers_reached(path, path.relative_to(ROOT).parts[:-1]) for path in paths))
    assert reached & set(LAYERS) - {layer} <= LAYERS[layer]


# HTTP and the console talk to the Supervisor facade alone: of the jobs, http imports the facade's module and the
# errors its methods raise; of the journal, the records and errors those methods return and raise.
FACADE = "supervisor.jobs.supervisor"
SHOWN_TYPES = {"supervisor.journal.records", "supervisor.journal.errors"}
BEHIND = ("supervisor.jobs", "supervisor.journal")


def reached_past_the_facade(path: Path) -> list[str]:
    """What ``path`` (an http module) imports from supervisor.jobs or supervisor.journal that the rule refuses."""
    wrong = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            wrong += [alias.name for alias in node.names if alias.name.startswith(BEHIND)]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(BEHIND):
            if node.module in (FACADE, *SHOWN_TYPES):
                continue
            wrong += [f"{node.module}.{alias.name}" for alias in node.names if not _error(node.module, alias.name)]
    return wrong


def _error(module: str, name: str) -> bool:
    """Whether ``from module import name`` names an exception class of supervisor.jobs."""
    thing = getattr(importlib.import_module(module), name, None)
    return module.startswith("supervisor.jobs") and isinstance(thing, type) and issubclass(thing, Exception)


def test_http_talks_only_to_the_supervisor_facade() -> None:
    paths = sorted((ROOT / "supervisor" / "http").rglob("*.py"))
    wrong = {str(path.relative_to(ROOT)): reached_past_the_facade(path) for path in paths}
    assert {path: names for path, names in wrong.items() if names} == {}


# The parts the facade wires: a route that reaches one through it (``sup.reader.get``) talks past it too.
PARTS = {
    "admission",
    "housekeeping",
    "journal",
    "launcher",
    "limits",
    "parts",
    "reader",
    "recorder",
    "retention",
    "roster",
    "runner",
    "sandbox",
}


def test_http_reaches_no_part_through_the_facade() -> None:
    reached = {
        f"{path.relative_to(ROOT)}: sup.{node.attr}"
        for path in sorted((ROOT / "supervisor" / "http").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "sup"
        if node.attr in PARTS
    }
    assert reached == set()


def test_only_the_conversation_speaks_to_a_job_s_worker() -> None:
    """What the supervisor sends a job's worker is named in one module: the conversation has one owner."""
    said = {"Start", "Stop", "DumpStacks", "Recorded"}
    speakers = {
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "supervisor").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("protocol")
        if said & {alias.name for alias in node.names}
    }
    assert speakers == {"supervisor/jobs/conversation.py"}


@pytest.mark.parametrize(
    "line",
    [
        "from supervisor.jobs import runner",
        "import supervisor.jobs.live",
        "from supervisor.jobs.outcomes import bounded",
        "from supervisor.journal.reader import Reader",
    ],
)
def test_the_facade_check_sees_a_reach_past_it(tmp_path: Path, line: str) -> None:
    module = tmp_path / "route.py"
    module.write_text(
        f"{line}\nfrom supervisor.jobs.stacks import Late\nfrom supervisor.jobs.supervisor import Supervisor\n"
    )
    assert len(reached_past_the_facade(module)) == 1


FORMS = ["import supervisor.http.app", "from supervisor.http import app", "from supervisor import http"]


@pytest.mark.parametrize("line", [*FORMS, "from ..http import app"])
def test_the_layer_check_sees_every_import_form(tmp_path: Path, line: str) -> None:
    module = tmp_path / "runner.py"
    module.write_text(f"{line}\n")
    assert layers_reached(module, ("supervisor", "jobs")) == {"http"}


def test_every_layer_says_what_it_holds() -> None:
    for layer in LAYERS:
        docstring = ast.get_docstring(ast.parse((ROOT / "supervisor" / layer / "__init__.py").read_text()))
        assert docstring and "\n" not in docstring


def test_the_worker_imports_crewai_only_once_its_environment_is_set() -> None:
    """Importing CrewAI writes under HOME (and as whoever runs it): a worker's modules import it only once the
    worker has set up the job's HOME, its umask and its user (worker/tether.py)."""
    probe = "import sys, worker.__main__, worker.job, worker.forkserver; print('crewai' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stdout + done.stderr


MAX_CLASS_LINES = 200  # a class past this holds two concerns (issue 28)
MAX_FUNCTION_LINES = 60


def test_no_class_or_function_in_the_supervisor_outgrows_one_concern() -> None:
    too_long = []
    for path in sorted((ROOT / "supervisor").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            bound = MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > bound:
                    too_long.append(f"{path.relative_to(ROOT)}: {node.name} has {lines} lines (at most {bound})")
    assert not too_long, "\n".join(too_long)


def module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(root: Path, path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``path`` imports, in every form and wherever (``if TYPE_CHECKING:`` and
    function bodies too); a name imported from a package is the submodule of that name when there is one."""
    package = path.relative_to(root).parts[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.update(f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names)
    return found & known


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Module -> the modules it imports, over every module of ``packages`` under ``root``."""
    paths = {module_name(root, path): path for package in packages for path in (root / package).rglob("*.py")}
    return {name: imports_of(root, path, set(paths)) - {name} for name, path in paths.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One import cycle, as ``[a, b, ..., a]``, through each group of modules that reach one another."""
    found: list[list[str]] = []
    seen: set[str] = set()
    for start in sorted(graph):
        if start in seen:
            continue
        group = {node for node in reachable(graph, start) if start in reachable(graph, node)}
        seen |= group | {start}
        if group:
            found.append(path_back(graph, start, group))
    return found


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    reached: set[str] = set()
    todo = list(graph[start])
    while todo:
        node = todo.pop()
        if node not in reached:
            reached.add(node)
            todo.extend(graph[node])
    return reached


def path_back(graph: dict[str, set[str]], start: str, group: set[str]) -> list[str]:
    """The shortest chain of imports from ``start`` back to itself, through ``group``."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while start not in came_from:
        reached = []
        for node in frontier:
            for target in sorted(graph[node] & group - came_from.keys()):
                came_from[target] = node
                reached.append(target)
        frontier = reached
    chain = [start]
    while len(chain) == 1 or chain[-1] != start:
        chain.append(came_from[chain[-1]])
    return chain[::-1]


def test_no_module_imports_itself_through_others() -> None:
    """No import circle in the house, not even one only a type checker follows (issue 45)."""
    found = cycles(import_graph(ROOT, ("supervisor", "worker", "protocol")))
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in found)


def test_the_cycle_check_names_a_cycle_seen_only_by_a_type_checker(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from pkg.b import B\n")
    (tmp_path / "pkg" / "b.py").write_text("def f():\n    from . import c\n")
    (tmp_path / "pkg" / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n")
    assert cycles(import_graph(tmp_path, ("pkg",))) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]
