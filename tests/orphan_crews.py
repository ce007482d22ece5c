"""A registry whose crew plays an orphan: it disarms the worker's own ways of dying with its
supervisor, so only restart fencing can stop it. ``AIP_CREWAI_REGISTRY=tests.orphan_crews:registry``."""

from __future__ import annotations

import ctypes
import os
import threading
import types

from crewai import Crew

from tests.crews import registry as base_registry
from tests.crews import stubborn
from worker import lifecycle

PR_SET_PDEATHSIG = 1


def immortal() -> Crew:
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0)
    forever = threading.Event()
    # The control thread looks up os._exit when its pipe closes: make that call block instead.
    patched = types.ModuleType("os")
    patched.__dict__.update(os.__dict__)
    patched._exit = lambda code: forever.wait()  # type: ignore[attr-defined]
    lifecycle.os = patched  # type: ignore[attr-defined]
    return stubborn()  # blocks in an LLM call, writing nothing that could fail on a dead pipe


registry = {**base_registry, "immortal": immortal}
