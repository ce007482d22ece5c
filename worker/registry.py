"""Load the crew registry named by AIP_CREWAI_REGISTRY (``module:attr``) and build a fresh crew per job."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from protocol import factory_fix, not_a_factory


class RegistryError(Exception):
    pass


def load(spec: str) -> dict[str, Any]:
    """The registry mapping; a callable attribute (not itself a mapping) is called first."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise RegistryError(f"registry {spec!r} is not of the form module:attr")
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        if not hasattr(target, part):
            raise RegistryError(f"registry {spec!r}: {module_name} imports but has no attribute {attr!r}")
        target = getattr(target, part)
    if callable(target) and not isinstance(target, Mapping):
        target = target()
    if not isinstance(target, Mapping) or not target:
        raise RegistryError(f"registry {spec!r} is not a non-empty mapping")
    for key in target:
        if not isinstance(key, str) or not key.strip():
            raise RegistryError(f"registry {spec!r} has a blank or non-string crew id {key!r}")
    return dict(target)


def eval_llms(spec: str) -> dict[str, Callable[[], Any]]:
    """The registry module's optional ``eval_llms`` (name -> zero-arg LLM factory) for ``test``.

    Lets a registry name offline or preconfigured evaluators; without it ``test`` hands the name to CrewAI.
    """
    module_name = spec.partition(":")[0]
    offered = getattr(importlib.import_module(module_name), "eval_llms", None) if module_name else None
    return dict(offered) if isinstance(offered, Mapping) else {}


class NotAFactory(RegistryError):
    """A registry value that cannot be called (a ``Crew`` instance, say): every job of that crew is refused."""

    def __init__(self, crew_id: str, entry: Any) -> None:
        super().__init__(not_a_factory(crew_id, type(entry).__name__))
        self.fix = factory_fix(crew_id)


def build(crew_id: str, entry: Any) -> Any:
    """A fresh Crew for one job from its zero-arg factory (a function, a class, a @CrewBase class).

    An instance is refused, not copied: it was built when the registry was imported, in the fork server before
    any job's environment, so its replay rows and knowledge are in the fork server's storage, not its crew's;
    ``Crew.copy()`` shares its LLMs' clients and token counters, tools and memory; a deep copy fails on the
    locks a Crew holds.
    """
    if not callable(entry):
        raise NotAFactory(crew_id, entry)
    crew = entry()
    # A @CrewBase class gives an object whose crew() builds the Crew.
    if not hasattr(crew, "kickoff") and callable(getattr(crew, "crew", None)):
        crew = crew.crew()
    return crew
