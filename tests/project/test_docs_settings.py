"""docs/settings.md is made from the settings table (supervisor/config.py's SPEC) by scripts/docs.py: CI fails
when someone changes a setting without making the page again. The check is shown failing on a stale copy."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from supervisor import config
from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))  # scripts/ is not a package
import docs


def test_the_page_is_what_the_table_makes() -> None:
    assert docs.SETTINGS_PAGE.read_text() == docs.settings_page(), f"docs/settings.md is stale: run {docs.REFRESH}"


def test_every_setting_has_a_row_with_its_default_and_range() -> None:
    rows = {
        line.split(" | ")[0].strip("| `"): line for line in docs.settings_page().splitlines() if line.startswith("| `")
    }
    assert list(rows) == list(config.SPEC)
    assert "| `4` | 1–1024 |" in rows["MAX_CONCURRENCY"]  # the range is _integer(1, 1024)'s own
    assert "| `268435456` (256 MiB) | 1048576 (1 MiB)–4294967296 (4 GiB) |" in rows["MAX_STATE_BYTES"]
    assert "| `forkserver` | `forkserver`, `spawn` |" in rows["LAUNCHER"]
    assert "| — | 0–64 |" in rows["PREFORK"]  # empty: sized from MAX_CONCURRENCY, as its help says


def test_a_changed_setting_changes_the_page() -> None:
    port = config.SPEC["PORT"]
    changed = {**config.SPEC, "PORT": port._replace(default="9000")}
    assert "| `PORT` | `9000` |" in docs.settings_page(changed)
    assert docs.settings_page(changed) != docs.settings_page()


def test_the_command_writes_the_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page = tmp_path / "docs" / "settings.md"
    page.parent.mkdir()
    page.write_text(docs.settings_page().replace("`8090`", "`8091`"))  # stale
    monkeypatch.setattr(docs, "ROOT", tmp_path)
    monkeypatch.setattr(docs, "SETTINGS_PAGE", page)
    assert docs.main(["settings"]) == 0
    assert page.read_text() == docs.settings_page()


def test_help_text_shows_as_written() -> None:
    assert docs.plain("a | b * c [d] <e>") == r"a \| b \* c \[d\] &lt;e&gt;"
    assert docs.plain("unless ALLOW_EPHEMERAL, or OPENAI_*") == "unless `ALLOW_EPHEMERAL`, or `OPENAI_*`"
