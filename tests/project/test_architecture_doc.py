"""docs/architecture.md's map of the house names every module of it: a module added is a module placed."""

from __future__ import annotations

from tests.conftest import ROOT

PACKAGES = ("protocol", "worker", "supervisor")


def test_every_module_is_on_the_map() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    modules = [
        path.relative_to(ROOT)
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if path.name not in ("__init__.py", "__main__.py")
    ]
    assert modules
    unnamed = [
        str(module)
        for module in modules
        if f"`{module.name}`" not in text and f"/{module.name}`" not in text  # alone, or with its folders
    ]
    assert unnamed == []
