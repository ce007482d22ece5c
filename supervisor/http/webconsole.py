"""The operator console: a browser page under ``/console``, served only when ``AIP_CREWAI_CONSOLE`` is on.

The files shipped in the package (``static/``: the page, its style and its script's modules) are read once
when the app is made, and one module more is made then from the enums (``names.js``: the statuses, phases, events,
operations and reasons the scripts compare and offer, so they spell none again). Nothing is fetched from elsewhere,
so the page works offline. The files are public (a browser loads a page without headers); they hold no data: the
page asks for the bearer token and sends it with each call to the API, as any client does. Every answer carries a
strict Content-Security-Policy (scripts and styles from these files only, no inline script, calls to this origin
only) and refuses to be framed.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import orjson
from fastapi import APIRouter, HTTPException
from fastapi.responses import RedirectResponse, Response

from protocol import Effect, EffectStatus, Operation, Reason
from supervisor.enums import ENDED, LIVE_PHASES, TERMINAL_EVENTS, EventName, Role, Status, WaitingFor
from supervisor.scopes import needs

PATH = "/console"
STATIC = resources.files("supervisor.http") / "static"
MEDIA = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
}
# Served name -> file in static/: each file there by its own name, and the page at /console/. Nothing else under
# /console is a file.
FILES = {"": "console.html"} | {
    entry.name: entry.name for entry in STATIC.iterdir() if entry.is_file() and Path(entry.name).suffix in MEDIA
}
NAMES = "names.js"  # made, not a file: the names the scripts import
# The module's exports: each enum as an object (member name -> its text), and the lists the page offers or checks.
ENUMS = {
    "STATUS": Status,
    "EVENT": EventName,
    "OPERATION": Operation,
    "REASON": Reason,
    "EFFECT": Effect,
    "EFFECT_STATUS": EffectStatus,
    "WAITING_FOR": WaitingFor,
}
LISTS = {"LIVE_PHASES": LIVE_PHASES, "ENDED": ENDED, "TERMINAL_EVENTS": TERMINAL_EVENTS}
# Served without the token (supervisor/http/auth.py), exactly these: not a prefix a crafted path could extend.
PUBLIC_PATHS = frozenset({PATH, *(f"{PATH}/{name}" for name in (*FILES, NAMES))})
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self';"
        " base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def names_module() -> bytes:
    """``names.js``: the console's names as a script module, from their one definition."""
    exports = {name: {member.name: member for member in enum} for name, enum in ENUMS.items()} | LISTS
    return b"".join(
        b"export const %s = Object.freeze(%s);\n" % (n.encode(), orjson.dumps(v)) for n, v in exports.items()
    )


def router() -> APIRouter:
    """The console's routes, its files read now (a missing file fails the start, not a page load)."""
    pages = {name: (STATIC.joinpath(file).read_bytes(), MEDIA[Path(file).suffix]) for name, file in FILES.items()}
    pages[NAMES] = (names_module(), MEDIA[".js"])
    routes = APIRouter(include_in_schema=False)

    @routes.api_route(PATH, methods=["GET", "HEAD"])
    @needs(Role.OBSERVER)
    async def console_root() -> Response:
        # The page's relative links (console.js) resolve against /console/, not /.
        return RedirectResponse(PATH + "/", 308, headers=HEADERS)

    @routes.api_route(PATH + "/{name}", methods=["GET", "HEAD"])
    @routes.api_route(PATH + "/", methods=["GET", "HEAD"])
    @needs(Role.OBSERVER)
    async def console_file(name: str = "") -> Response:
        if name not in pages:
            raise HTTPException(404, "no such console file")
        body, media = pages[name]
        return Response(body, media_type=media, headers=HEADERS)

    return routes
