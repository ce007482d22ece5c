"""What each route lets a token's role do: a route declares the least role it needs with ``@needs(Role.X)`` on its
endpoint; one that declares nothing needs the contract's token, so a route added later is not open to an observer
or an operator token until it says so. The bearer middleware (``supervisor/http/auth.py``) finds the route a request
goes to, as the router will, before anything is read or run; a request no route takes goes on to the router, whose
404, 405 or redirect (307, to the path with or without its last slash, judged again there) runs nothing. Here, not
in supervisor/http/, as ``/metrics`` is declared in supervisor/metrics.py, which the jobs import.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from starlette.routing import BaseRoute, Match
from starlette.types import Scope

from supervisor.enums import ROLES, Role

ATTRIBUTE = "needs_role"
Endpoint = TypeVar("Endpoint", bound=Callable[..., Any])


def needs(role: Role) -> Callable[[Endpoint], Endpoint]:
    """Declares the least role an endpoint needs (it is left as it is, so FastAPI reads its signature)."""

    def declare(endpoint: Endpoint) -> Endpoint:
        setattr(endpoint, ATTRIBUTE, role)
        return endpoint

    return declare


def needed(routes: Sequence[BaseRoute], scope: Scope) -> tuple[Role, str] | None:
    """The role the route serving ``scope`` needs, and that route's path; None when no route takes it (the router
    answers 404, 405 or a redirect). ``routes`` must be every route the app serves (``supervisor/http/app.py``
    checks), so that none is reached by a token that this finds no route for."""
    for route in routes:
        match, _ = route.matches(scope)
        if match == Match.FULL:
            return getattr(getattr(route, "endpoint", None), ATTRIBUTE, Role.CONTRACT), getattr(route, "path", "")
    return None


def allows(role: Role, needs_role: Role) -> bool:
    return ROLES.index(role) >= ROLES.index(needs_role)


def refusal(role: Role, needs_role: Role, method: str, path: str) -> str:
    """The 403's detail: what was refused and which token would do it."""
    whom = "an operator token or the contract's token" if needs_role == Role.OPERATOR else "the contract's token"
    return f"an {role} token may not {method} {path}: that needs {whom}"
