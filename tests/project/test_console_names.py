"""The console, chaos, the doctor and the journal take a job's statuses, phases and event names and an effect's
statuses from their one definition (supervisor/enums.py, protocol/vocabulary.py), never spelled again as text."""

from __future__ import annotations

from protocol import EffectStatus
from supervisor.enums import EventName, Phase, Status
from tests.conftest import ROOT
from tests.project.test_vocabulary import spelled

FOLDERS = ("console", "chaos", "doctor", "journal")
NAMES = {name.value for names in (Status, Phase, EventName, EffectStatus) for name in names}
# The same word meaning something else: a column's header, a verb said of a bulk cancel, a key of /workers' JSON.
ELSEWHERE = {
    ROOT / "supervisor" / "console" / "effects.py": {"started"},  # the column of when a call started
    ROOT / "supervisor" / "console" / "views.py": {"cancelled", "running"},  # "cancelled 3 jobs"; waiting's "running"
}


def test_the_console_s_names_come_from_their_one_definition() -> None:
    sources = sorted(path for folder in FOLDERS for path in (ROOT / "supervisor" / folder).rglob("*.py"))
    found = [where for path in sources for where in spelled(path, NAMES - ELSEWHERE.get(path, set()))]
    assert found == []
