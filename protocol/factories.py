"""What a registry value must be, in words both sides say: a worker refusing one fails its jobs with them,
and ``crew-supervisor doctor`` recognises them and gives the same fix."""

from __future__ import annotations

import re

NOT_A_FACTORY = "not a zero-arg factory"


def not_a_factory(crew_id: str, kind: str) -> str:
    """Why the registry value ``crew_id`` (of type ``kind``: a ``Crew``, say) is refused."""
    return f"registry value {crew_id!r} is a {kind} instance, {NOT_A_FACTORY}"


def factory_fix(crew_id: str) -> str:
    """The one-line fix, naming a factory after the crew id (``research`` -> ``make_research``)."""
    name = "make_" + re.sub(r"\W+", "_", crew_id).strip("_").lower()
    return f"make {crew_id!r} a zero-arg function that returns the Crew: registry = {{{crew_id!r}: {name}}}"
