"""docs/api.md against the OpenAPI schema a real supervisor serves: every route, its statuses and request
headers, and the request bodies' fields.

The page names a route one way only, `` `METHOD /path` `` with the path as the schema spells it; every
route the schema serves must head a section, and every route the page names must be served. A route's
section runs from its heading to the next heading. Its ``Statuses:`` paragraph, with the page's one
``Statuses on every route:`` paragraph, must give exactly the codes of the schema's ``responses`` for it
and its status table no code beyond them. Its ``Headers:``
paragraph must name every header parameter the schema declares for it, and nothing the schema lacks.
The field tables under the headings ``{#start-body}`` and ``{#cancel-body}`` must list exactly the
properties of those routes' request models, with their required flags, defaults and bounds.
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
HEADING = re.compile(r"^(#.*)$", re.MULTILINE)
CODE = re.compile(r"\b[1-5]\d\d\b")
BACKTICKED = re.compile(r"`([^`]+)`")
# The page's field tables (by their heading's anchor) and the route whose request model each documents.
BODY_TABLES = {"start-body": ("post", "/jobs"), "cancel-body": ("post", "/jobs/{action_id}/cancel")}
BOUNDS = ("minLength", "maxLength", "minimum", "maximum")
# The page's header tables (by their heading's anchor) and the routes whose headers each documents: a
# header it lists must be the schema's for one of them (the aliases take the same ones).
HEADER_TABLES = {"start-headers": (("POST", "/jobs"), ("POST", "/jobs/stream"))}
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


def route_sections(page: str) -> dict[Route, str]:
    """Each route named in a heading, with the text up to the next heading. Code blocks are left out, where
    a ``#`` starts a shell comment, not a heading."""
    parts = HEADING.split(FENCE.sub("", page))
    return {
        route: body for heading, body in zip(parts[1::2], parts[2::2], strict=True) for route in named_routes(heading)
    }


def heading_routes(page: str) -> set[Route]:
    return set(route_sections(page))


def paragraph(text: str, lead: str) -> str | None:
    """The rest of the paragraph that starts with ``lead`` (a paragraph ends at a blank line); None if none."""
    found = re.search(rf"^{re.escape(lead)}(.*?)(?:\n\s*\n|\Z)", text, re.MULTILINE | re.DOTALL)
    return found[1] if found else None


def codes(text: str) -> set[int]:
    return {int(code) for code in CODE.findall(text)}


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def table_statuses(section: str) -> set[int]:
    """The codes in the first column of the section's tables whose first column is headed ``Status``."""
    found: set[int] = set()
    for table in re.findall(r"(?:^\|.*(?:\n|$))+", section, re.MULTILINE):
        header, _, *rows = table.splitlines()  # the second line is the |---| one
        if cells(header)[0] == "Status":
            found |= {code for row in rows for code in codes(cells(row)[0])}
    return found


def header_name(header: str) -> str:
    """``Content-Type: application/json`` names ``Content-Type``."""
    return header.partition(":")[0].strip()


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
            rows.append(cells(line))
        elif rows:
            break
    if len(rows) < 2:
        return None
    header, body = rows[0], rows[2:]  # rows[1] is the |---| line
    return {row[0].strip("`"): dict(zip(header, row, strict=True)) for row in body}


def operation(schema: dict[str, Any], route: Route) -> dict[str, Any]:
    method, path = route
    return schema["paths"][path][method.lower()]  # type: ignore[no-any-return]


def operations(schema: dict[str, Any]) -> list[dict[str, Any]]:
    return [operation(schema, route) for route in sorted(served_routes(schema))]


def declared_statuses(op: dict[str, Any]) -> set[int]:
    return {int(code) for code in op["responses"]}


def declared_headers(op: dict[str, Any]) -> set[str]:
    return {param["name"] for param in op.get("parameters", []) if param["in"] == "header"}


def bearer(schema: dict[str, Any]) -> bool:
    """The schema's bearer scheme, required on every operation: the page's global token rule."""
    scheme = schema.get("components", {}).get("securitySchemes", {}).get("bearer", {})
    return schema.get("security") == [{"bearer": []}] and scheme == {"type": "http", "scheme": "bearer"}


def in_schema(header: str, op: dict[str, Any], schema: dict[str, Any]) -> bool:
    """Whether the schema has ``header`` (``Name`` or ``Name: value``) for the operation. OpenAPI ignores header
    parameters named Accept, Content-Type or Authorization: it says them with the answer's media types, the
    request body's and the security scheme, so those three are looked up there."""
    name, value = header_name(header).lower(), header.partition(":")[2].strip()
    if name == "authorization":
        return bearer(schema) and (not value or value.startswith("Bearer "))
    media = {
        "content-type": op.get("requestBody", {}).get("content", {}),
        "accept": op["responses"].get("200", {}).get("content", {}),
    }
    if name in media:
        return bool(media[name]) and (not value or value in media[name])
    return name in {declared.lower() for declared in declared_headers(op)}


def status_problems(route: Route, section: str, every: set[int], op: dict[str, Any]) -> list[str]:
    """Where the codes the page gives the route (its own and every route's) and the schema's disagree."""
    name = f"`{route[0]} {route[1]}`"
    line = paragraph(section, "Statuses:")
    if line is None:
        return [f"{name}: its section has no Statuses: line"]
    own, declared = codes(line), declared_statuses(op)
    answered = own | every
    found = [
        f"{name}: its status table has {code}, its Statuses: line does not"
        for code in sorted(table_statuses(section) - own)
    ]
    found += [f"{name}: the schema declares {code}, the page does not" for code in sorted(declared - answered)]
    found += [f"{name}: the page says {code}, the schema does not declare it" for code in sorted(answered - declared)]
    return found


def every_route_problems(every: set[int] | None, schema: dict[str, Any]) -> list[str]:
    """The every-route line: exactly the codes the schema declares on every operation."""
    if every is None:
        return ["no Statuses on every route: line"]
    everywhere = set.intersection(*(declared_statuses(op) for op in operations(schema))) - {200}  # each route's own
    return [
        f"every route: the schema declares {code} everywhere, the line does not" for code in sorted(everywhere - every)
    ] + [
        f"every route: the line says {code}, which the schema does not declare everywhere"
        for code in sorted(every - everywhere)
    ]


def header_problems(route: Route, section: str, schema: dict[str, Any]) -> list[str]:
    """Where the route's Headers: line and the schema's header parameters for it disagree."""
    name, op = f"`{route[0]} {route[1]}`", operation(schema, route)
    listed = BACKTICKED.findall(paragraph(section, "Headers:") or "")
    names = {header_name(header).lower() for header in listed}
    found = [
        f"{name}: the schema's header {header} is not on its Headers: line"
        for header in sorted(declared_headers(op))
        if header.lower() not in names
    ]
    found += [
        f"{name}: the page lists `{header}`, the schema has no such header for it"
        for header in listed
        if not in_schema(header, op, schema)
    ]
    return found


def header_table_problems(page: str, schema: dict[str, Any]) -> list[str]:
    found: list[str] = []
    for anchor, routes in HEADER_TABLES.items():
        table = field_table(page, anchor)
        if table is None:
            found.append(f"no header table under the heading {{#{anchor}}}")
            continue
        found += [
            f"{anchor}: `{header}` is not the schema's for any of {sorted(routes)}"
            for header in table
            if not any(in_schema(header, operation(schema, route), schema) for route in routes)
        ]
    return found


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
    prose = FENCE.sub("", page)
    every_line = paragraph(prose, "Statuses on every route:")
    every = codes(every_line) if every_line is not None else None
    found += every_route_problems(every, schema)
    for route, section in sorted(route_sections(page).items()):
        if route in served:
            found += status_problems(route, section, every or set(), operation(schema, route))
            found += header_problems(route, section, schema)
    found += header_table_problems(page, schema)
    # Authorization is no route's own header: the page states it once for all, the schema as its scheme.
    if "`Authorization: Bearer <token>`" not in prose or not bearer(schema):
        found.append("the token rule: the page's `Authorization: Bearer <token>` or the schema's bearer scheme is gone")
    return found


def test_the_page_matches_the_served_schema(page: str, schema: dict[str, Any]) -> None:
    assert problems(page, schema) == []
    # Not vacuous: the page names every route, and its tables hold the models' fields.
    assert named_routes(page) == served_routes(schema) and len(served_routes(schema)) >= 15
    assert set(field_table(page, "start-body") or {}) == {"crew_id", "action_id", "operation", "input", "timeout_ms"}
    assert set(field_table(page, "cancel-body") or {}) == {"crew_id", "action_id", "reason"}
    # The schema holds what FastAPI adds: 422 exactly where an operation has parameters or a body, and the
    # app's own 400, 401, 408 and 431 everywhere; so the status check compares against those too.
    for route in served_routes(schema):
        op = operation(schema, route)
        assert (422 in declared_statuses(op)) == bool(op.get("parameters") or op.get("requestBody")), route
        assert {400, 401, 408, 431} <= declared_statuses(op), route
    # The headers the check found: the schema declares these, and the page names them where it should.
    assert {
        (route, header) for route in served_routes(schema) for header in declared_headers(operation(schema, route))
    } >= {
        (("POST", "/jobs"), "Idempotency-Key"),
        (("POST", "/jobs/stream"), "Last-Event-ID"),
        (("GET", "/jobs/{action_id}/events"), "Last-Event-ID"),
        (("DELETE", "/jobs/{action_id}"), "X-AIP-Archive-Confirmation"),
    }


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
    "a status code removed from a route": lambda page: page.replace(
        "Statuses: 200, 400, 404, 416, 422.", "Statuses: 200, 400, 404, 422.", 1
    ),
    "a status code invented": lambda page: page.replace(
        "Statuses: 200, 400, 404, 422.", "Statuses: 200, 400, 404, 409, 422.", 1
    ),
    "a route's Statuses line gone": lambda page: page.replace("Statuses: 200.\n", "", 1),
    "a status table beyond its line": lambda page: page.replace(
        "| 400 | the body's `action_id` differs", "| 409 | the body's `action_id` differs", 1
    ),
    "416 on a blocking start, which reads no Last-Event-ID": lambda page: page.replace(
        "413, 422, 428, 502", "413, 416, 422, 428, 502", 1
    ),
    "an every-route status dropped": lambda page: page.replace("408, 413, 431, 503.", "408, 413, 503.", 1),
    "an every-route status invented": lambda page: page.replace("408, 413, 431, 503.", "408, 413, 422, 431, 503.", 1),
    "a header dropped from a route": lambda page: page.replace("Headers: `X-AIP-Archive-Confirmation`.", "", 1),
    "a header dropped from a streamed start": lambda page: page.replace(
        "Headers: `Idempotency-Key`, `Last-Event-ID`, ", "Headers: `Idempotency-Key`, ", 1
    ),
    "a header invented for a route": lambda page: page.replace(
        "Headers: `Idempotency-Key`, `Content-Type", "Headers: `Idempotency-Key`, `Last-Event-ID`, `Content-Type", 1
    ),
    "a media type the route does not offer": lambda page: page.replace(
        "`Accept: text/event-stream`.", "`Accept: text/plain`.", 1
    ),
    "an unread header in a header table": lambda page: page.replace(
        "| `Last-Event-ID` | streamed starts only",
        "| `X-AIP-Action-ID` | sent |\n| `Last-Event-ID` | streamed starts only",
        1,
    ),
}


@pytest.mark.parametrize("change", list(STALE))
def test_a_stale_page_fails(page: str, schema: dict[str, Any], change: str) -> None:
    stale = STALE[change](page)
    assert stale != page, f"{change}: the page no longer has what this change edits"
    assert problems(stale, schema) != []
