"""What the journal's tests share: a journal's path in a private state directory, as ``serve`` prepares it."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.journal.statefiles import prepare_directory


@pytest.fixture
def path(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    prepare_directory(state)
    return state / "journal.db"
