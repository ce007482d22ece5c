"""The HTTP app: bearer middleware, the routers (contract, operator, metrics; the console's when on)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from supervisor.http import contract, operator
from supervisor.http.auth import BearerAuth
from supervisor.http.responses import BEARER_SCHEME, errors
from supervisor.jobs.admission import (
    ConflictingReuse,
    CrewDiskFull,
    CrewNotFound,
    InputInvalid,
    InputTooLarge,
    JournalFull,
    JournalUnavailable,
    KeyInvalid,
    KeyMissing,
    NotResumable,
    OperationDisabled,
    Refused,
    ResumeUnknown,
    ShuttingDown,
    WrongRoute,
)
from supervisor.jobs.supervisor import Supervisor
from supervisor.metrics import router as metrics_router

# The input bound is 1 MiB of compact JSON; the envelope and pretty-printing get room beside it.
MAX_BODY_BYTES = 4 * 1024 * 1024
# What the reference answers for each refused start.
REFUSALS: dict[type[Refused], int] = {
    ShuttingDown: 503,
    InputTooLarge: 413,
    WrongRoute: 400,
    OperationDisabled: 403,
    KeyMissing: 428,
    KeyInvalid: 400,
    InputInvalid: 422,
    CrewNotFound: 404,
    ConflictingReuse: 409,
    ResumeUnknown: 404,
    NotResumable: 409,
    JournalFull: 507,
    CrewDiskFull: 507,
    JournalUnavailable: 503,
}
RETRY_AFTER_SECONDS: dict[type[Refused], str] = {
    ShuttingDown: "5",
    JournalUnavailable: "1",
}


def create_app(sup: Supervisor) -> FastAPI:
    """The routes of a supervisor already open (``Supervisor.open`` starts and stops it, not the app's lifespan)."""
    app = FastAPI(
        title="crew-supervisor",
        version="0.1.0",
        max_body_size=MAX_BODY_BYTES,
        # FastAPI's /docs and /redoc pages load their scripts from a CDN; /openapi.json stays.
        docs_url=None,
        redoc_url=None,
        # The middleware, the body limit and the connection's bounds answer these on any route (403: a scoped token).
        responses=errors(400, 401, 403, 408, 413, 431, 503),
    )
    app.state.supervisor = sup
    app.state.metrics = sup.metrics
    public: frozenset[str] = frozenset()
    # The operator routes answer 404 (unknown job) and 422 with a sentence (bad page cursor, path id).
    routers = [contract.router, operator.router, metrics_router]
    if sup.settings.console:
        # Imported only when on: off, the console adds nothing to the supervisor, not even its files' bytes.
        from supervisor.http import webconsole

        routers.insert(0, webconsole.router())
        public = webconsole.PUBLIC_PATHS
    # Starlette types a handler as taking any Exception; this one is registered for Refused alone.
    app.add_exception_handler(Refused, refused)  # type: ignore[arg-type]
    for router in routers:
        app.include_router(router)
    # Each route as the middleware matches it: FastAPI's own (/openapi.json), then each router's. Every one: a
    # request it finds no route for goes on to the router as a 404 or 405 with a scoped token too.
    routes: list[BaseRoute] = [route for route in app.router.routes if isinstance(route, Route)]
    if len(app.router.routes) - len(routes) != len(routers):  # a Mount, say: the middleware could not judge it
        raise RuntimeError("the app serves a route the bearer middleware does not know")
    routes += [route for router in routers for route in router.routes]
    app.add_middleware(BearerAuth, credentials=sup.credentials, routes=routes, public=public)
    generated_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        """The generated schema plus the bearer scheme the middleware enforces."""
        schema = generated_openapi()
        schema.setdefault("components", {})["securitySchemes"] = BEARER_SCHEME
        schema["security"] = [{"bearer": []}]
        return schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to change the schema
    return app


async def refused(request: Request, exc: Refused) -> JSONResponse:
    retry_after = RETRY_AFTER_SECONDS.get(type(exc))
    headers = {"Retry-After": retry_after} if retry_after is not None else None
    return JSONResponse({"detail": str(exc)}, REFUSALS[type(exc)], headers=headers)
