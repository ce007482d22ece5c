"""Load the crew registry named by AIP_CREWAI_REGISTRY (``module:attr``) and build fresh crews."""

from __future__ import annotations

import copy
import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

ENV = "AIP_CREWAI_REGISTRY"


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


def build(entry: Any) -> Any:
    """A fresh Crew per job: factories are called, instances are deep-copied."""
    if inspect.isclass(entry) or inspect.isfunction(entry) or inspect.ismethod(entry):
        crew = entry()
    elif hasattr(entry, "model_copy"):
        crew = entry.model_copy(deep=True)
    elif hasattr(entry, "copy"):
        crew = entry.copy()
    else:
        crew = copy.deepcopy(entry)
    # A @CrewBase class gives an object whose crew() builds the Crew.
    if not hasattr(crew, "kickoff") and callable(getattr(crew, "crew", None)):
        crew = crew.crew()
    return crew
