"""docs/api.md against the OpenAPI schema a real supervisor serves: every route, and the request bodies' fields.

The page names a route one way only, `` `METHOD /path` `` with the path as the schema spells it; every
route the schema serves must head a section, and every route the page names must be served. The field
tables under the headings ``{#start-body}`` and ``{#cancel-body}`` must list exactly the properties of
those routes' request models, with their required flags, defaults and bounds.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import ROOT, start_server, stop_server

PAGE = ROOT / "docs" / "api.md"
ROUTE = re.compile(r"`(GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS) (/[^`\s]*)`")
METHODS = ("get", "post", "put", "patch", "delete", "head", "options")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
# The page's field tables (by their heading's anchor) and the route whose request model each documents.
BODY_TABLES = {"start-body": ("post", "/jobs"), "cancel-body": ("post", "/jobs/{action_id}/cancel")}
BOUNDS = ("minLength", "maxLength", "minimum", "maximum")
Route = tuple[str, str]
Table = dict[str, dict[str, str]]


@pytest.fixture(scope="module")
def schema(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The served schema; spawned workers, since no job runs here and a fork server's warm-up costs CPU."""
    server = start_server(tmp_path_factory.mktemp("docs") / "state", env={"AIP_CREWAI_LAUNCHER": "spawn"})
    try:
        with server.client() as client:
            response = client.get("/openapi.json")
    finally:
        stop_server(server)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def page() -> str:
    return PAGE.read_text(encoding="utf-8")


def served_routes(schema: dict[str, Any]) -> set[Route]:
    return {(method.upper(), path) for path, item in schema["paths"].items() for method in item if method in METHODS}


def named_routes(text: str) -> set[Route]:
    return {(method, path) for method, path in ROUTE.findall(text)}


def heading_routes(page: str) -> set[Route]:
    """Routes named in headings; code blocks are left out, where a ``#`` starts a shell comment."""
    prose = FENCE.sub("", page)
    return named_routes("\n".join(line for line in prose.splitlines() if line.startswith("#")))


def field_table(page: str, anchor: str) -> Table | None:
    """The first table after the heading with ``{#anchor}``: each row's cells by column, keyed by its field."""
    lines = FENCE.sub("", page).splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("#") and f"{{#{anchor}}}" in line), None)
    if start is None:
        return None
    rows: list[list[str]] = []
    for line in lines[start + 1 :]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            break
    if len(rows) < 2:
        return None
    header, body = rows[0], rows[2:]  # rows[1] is the |---| line
    return {row[0].strip("`"): dict(zip(header, row, strict=True)) for row in body}


def request_model(schema: dict[str, Any], method: str, path: str) -> dict[str, Any]:
    body = schema["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]
    name = body["$ref"].rsplit("/", 1)[-1]
    return schema["components"]["schemas"][name]  # type: ignore[no-any-return]


def bounds(prop: dict[str, Any]) -> list[str]:
    """The property's numeric bounds as the page writes them (``3600000``, not ``3600000.0``)."""
    found = [prop[key] for key in BOUNDS if key in prop]
    found += [branch[key] for branch in prop.get("anyOf", []) for key in BOUNDS if key in branch]
    return [str(int(value)) if float(value).is_integer() else str(value) for value in found]


def written(value: Any) -> str:
    return f"`{value if isinstance(value, str) else json.dumps(value)}`"


def body_problems(name: str, table: Table, model: dict[str, Any]) -> list[str]:
    props, required = model["properties"], set(model.get("required", []))
    problems = [f"{name}: field {field!r} is not in the schema" for field in sorted(set(table) - set(props))]
    problems += [f"{name}: schema field {field!r} is not documented" for field in sorted(set(props) - set(table))]
    for field in sorted(set(table) & set(props)):
        row, prop = table[field], props[field]
        if (row.get("Required", "").lower() == "yes") != (field in required):
            problems.append(f"{name}: {field!r} is {'' if field in required else 'not '}required in the schema")
        if "default" in prop and written(prop["default"]) not in row.get("Default", ""):
            problems.append(f"{name}: {field!r} defaults to {written(prop['default'])} in the schema")
        numbers = set(re.findall(r"\d+", row.get("Type and bounds", "")))
        problems += [
            f"{name}: {field!r} has the bound {bound} in the schema" for bound in bounds(prop) if bound not in numbers
        ]
        problems += [
            f"{name}: {field!r} may be {value!r}"
            for value in prop.get("enum", [])
            if written(value) not in row.get("Type and bounds", "")
        ]
    return problems


def problems(page: str, schema: dict[str, Any]) -> list[str]:
    """Everything in which the page and the schema disagree; empty when the page is current."""
    served = served_routes(schema)
    found = [f"not documented in a heading: `{m} {p}`" for m, p in sorted(served - heading_routes(page))]
    found += [f"not served: `{m} {p}`" for m, p in sorted(named_routes(page) - served)]
    for anchor, (method, path) in BODY_TABLES.items():
        table = field_table(page, anchor)
        if table is None:
            found.append(f"no field table under the heading {{#{anchor}}}")
        else:
            found += body_problems(anchor, table, request_model(schema, method, path))
    return found


def test_the_page_matches_the_served_schema(page: str, schema: dict[str, Any]) -> None:
    assert problems(page, schema) == []
    # Not vacuous: the page names every route, and its tables hold the models' fields.
    assert named_routes(page) == served_routes(schema) and len(served_routes(schema)) >= 15
    assert set(field_table(page, "start-body") or {}) == {"crew_id", "action_id", "operation", "input", "timeout_ms"}
    assert set(field_table(page, "cancel-body") or {}) == {"crew_id", "action_id", "reason"}


def _drop_row(field: str) -> Callable[[str], str]:
    return lambda page: re.sub(rf"^\| `{field}` \|.*\n", "", page, count=1, flags=re.MULTILINE)


STALE: dict[str, Callable[[str], str]] = {
    "a route gone": lambda page: page.replace("`GET /workers`", "GET workers"),
    "an alias left out of its heading": lambda page: page.replace(
        "### `POST /jobs/stream`, `POST /runs/stream`", "### `POST /jobs/stream`"
    ),
    "a route invented": lambda page: page + "\nAlso `GET /runs/{action_id}/events`.\n",
    "a start field gone": _drop_row("timeout_ms"),
    "a start field invented": lambda page: page.replace(
        "| `input` | no |", "| `inputs` | no | an object | |\n| `input` | no |", 1
    ),
    "a cancel field renamed": lambda page: page.replace("| `reason` | no |", "| `message` | no |", 1),
    "a field's required flag": lambda page: page.replace("| `operation` | no |", "| `operation` | yes |", 1),
    "a default": lambda page: page.replace("| `600000` |", "| `60000` |", 1),
    "a bound": lambda page: page.replace("integer from 1 to 3600000", "integer from 1 to 360000", 1),
    "an operation left out": lambda page: page.replace(
        "`knowledge_query`, `memory_reset` ([Operations]", "`knowledge_query` ([Operations]", 1
    ),
    "a table's anchor": lambda page: page.replace("{#cancel-body}", "{#cancel}", 1),
}


@pytest.mark.parametrize("change", list(STALE))
def test_a_stale_page_fails(page: str, schema: dict[str, Any], change: str) -> None:
    stale = STALE[change](page)
    assert stale != page, f"{change}: the page no longer has what this change edits"
    assert problems(stale, schema) != []
