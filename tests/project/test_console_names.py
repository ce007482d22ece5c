"""The console, chaos, the doctor and the journal take a job's statuses, phases and event names and an effect's
statuses from their one definition (supervisor/enums.py, protocol/vocabulary.py), never spelled again as text. The
browser console's files too: they import the names from the module the server makes of them (``/console/names.js``,
supervisor/http/webconsole.py)."""

from __future__ import annotations

import re
from pathlib import Path

import orjson

from protocol import Effect, EffectStatus, Operation, Reason
from supervisor.enums import LIVE_PHASES, TERMINAL_EVENTS, EventName, Phase, Readiness, Status, WaitingFor
from supervisor.http.webconsole import names_module
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


STATIC = ROOT / "supervisor" / "http" / "static"
WEB_NAMES = {
    name.value
    for names in (Status, Phase, EventName, Operation, Reason, Effect, EffectStatus, WaitingFor, Readiness)
    for name in names
}
# The same word meaning something else in a browser console's file: a column's header or a label (a job's crew, when
# a call started), a call's deadline (api.js's option, not a failure's reason).
WEB_ELSEWHERE = {
    "console.html": {"started", "crew"},
    "job.js": {"crew", "timeout"},
    "workers.js": {"timeout"},
}
# A JavaScript file's comments, its string literals (quoted or a template's text between its ${...}: a template
# nested in a ${...} is not followed) and its object literals' bare keys (a name and a colon after a brace or a
# comma: `{ timeout: "..." }` is the string "timeout", a ternary's `a ? b : c` no key).
JS_TOKENS = re.compile(
    r"//[^\n]*|/\*.*?\*/"
    r"|\"(?P<double>(?:[^\"\\\n]|\\.)*)\"|'(?P<single>(?:[^'\\\n]|\\.)*)'"
    r"|`(?P<template>(?:[^`\\]|\\.)*)`"
    r"|[{,]\s*(?P<key>[A-Za-z_$][\w$]*)(?=\s*:)",
    re.DOTALL,
)
# An HTML file's text between tags, and its attributes' values.
HTML_TEXTS = re.compile(r">(?P<text>[^<]*)<|=\"(?P<value>[^\"]*)\"")


def web_literals(path: Path) -> list[tuple[int, str]]:
    """Each text of ``path`` (a JavaScript or an HTML file of the console) that is a literal there, with its line."""
    text = path.read_text()
    if path.suffix == ".js":
        found = [(match, value) for match in JS_TOKENS.finditer(text) for value in js_values(match)]
    else:
        found = [(match, match.group("text") or match.group("value") or "") for match in HTML_TEXTS.finditer(text)]
    return [(text.count("\n", 0, match.start()) + 1, value.strip()) for match, value in found]


def js_values(match: re.Match[str]) -> list[str]:
    if match.group("template") is not None:
        return re.split(r"\$\{[^}]*\}", match.group("template"))
    return [value for group in ("double", "single", "key") if (value := match.group(group)) is not None]


def spelled_in_page(path: Path, names: set[str]) -> list[str]:
    """Where a literal in ``path`` (a file of the browser console) is one of ``names``."""
    return [f"{path.name}:{line}: {value!r}" for line, value in web_literals(path) if value in names]


def test_the_browser_console_s_names_come_from_their_one_definition() -> None:
    files = sorted(path for path in STATIC.iterdir() if path.suffix in (".js", ".html"))
    found = [
        where for path in files for where in spelled_in_page(path, WEB_NAMES - WEB_ELSEWHERE.get(path.name, set()))
    ]
    assert found == []


def test_the_names_module_is_the_enums() -> None:
    exports = {}
    for line in names_module().decode().splitlines():
        export = re.fullmatch(r"export const (\w+) = Object\.freeze\((.*)\);", line)
        assert export, line
        exports[export[1]] = orjson.loads(export[2])
    assert exports["OPERATION"] == {member.name: member.value for member in Operation}
    assert exports["REASON"]["TIMEOUT"] == Reason.TIMEOUT
    assert exports["LIVE_PHASES"] == list(LIVE_PHASES)
    assert exports["TERMINAL_EVENTS"] == list(TERMINAL_EVENTS)


def test_the_page_check_sees_a_literal_in_any_place(tmp_path: Path) -> None:
    script = tmp_path / "view.js"
    script.write_text(
        '// "failed" in a comment is prose\nif (job.status === "failed" || x === \'queued\') f(`chunk`);\n'
        'const WORDS = { timeout: "it reached its timeout", [REASON.CRASH]: `a ${"run"} x` };\n'
        "const s = `status-${job.status}`; a ? b : c;\n"
    )
    page = tmp_path / "page.html"
    page.write_text('<select name="status"><option>train</option><option value="replay">again</option></select>\n')
    names = {"failed", "queued", "chunk", "timeout", "run", "status", "train", "replay", "b"}
    assert spelled_in_page(script, names) == [
        "view.js:2: 'failed'",
        "view.js:2: 'queued'",
        "view.js:2: 'chunk'",
        "view.js:3: 'timeout'",
    ]
    assert spelled_in_page(page, names) == ["page.html:1: 'status'", "page.html:1: 'train'", "page.html:1: 'replay'"]


# A stylesheet cannot import: a status's colour is its class's (`status-<name>`, `effect-<name>`), so each class
# there names a real status, phase, event, readiness or effect status, and a renamed one fails here, not silently.
def test_the_stylesheet_s_classes_name_real_names() -> None:
    classes = re.findall(r"\.(?:status|effect)-([\w-]+)", (STATIC / "console.css").read_text())
    assert classes
    assert sorted(set(classes) - WEB_NAMES) == []
