"""A worker process's state is its one ``WorkerState`` (worker/state.py), passed to what needs it: no module of the
worker (nor of the protocol) rebinds a name of its own at run time."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_no_module_rebinds_its_own_names() -> None:
    rebinding = [
        f"{path.relative_to(ROOT)}:{node.lineno}: global {', '.join(node.names)}"
        for package in ("worker", "protocol")
        for path in sorted((ROOT / package).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Global)
    ]
    assert rebinding == []
