"""What the routers share: the supervisor they serve (a dependency) and strict JSON bodies."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute

from supervisor.jobs.supervisor import Supervisor
from supervisor.models import strict_json


def supervisor(request: Request) -> Supervisor:
    # Starlette's State holds Any; create_app puts the Supervisor there, and nothing else sets it.
    return request.app.state.supervisor  # type: ignore[no-any-return]


Sup = Annotated[Supervisor, Depends(supervisor)]


class StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = strict_json(await self.body())
        return self._json


class StrictJSONRoute(APIRoute):
    """Bodies are parsed by ``strict_json``: what orjson cannot carry is a 422 here, not a 500 later."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict
