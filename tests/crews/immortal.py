"""The one registry plus ``immortal``, a crew that disarms its worker's own ways of dying with its supervisor.

Apart because its factory does so to the process that builds it: a doctor's check worker, which builds every crew
of the registry it checks, would outlive a doctor that died. ``AIP_CREWAI_REGISTRY=tests.crews.immortal:registry``.
"""

from __future__ import annotations

import ctypes
import os
import threading
import types

from crewai import Crew

from tests.crews import eval_llms
from tests.crews import registry as one_registry
from tests.crews.base import stubborn
from tests.crews.hostile import leave_pid
from worker import tether

PR_SET_PDEATHSIG = 1
EXIT_REFUSED = "exit-refused.pids"  # in EVIDENCE_DIR: immortal workers that were told to exit and did not


def immortal() -> Crew:
    """Disarms the worker's own ways of dying with its supervisor: only restart fencing stops it. Where its
    control thread would exit (its pipe closed, or a Stop), it appends its pid to EXIT_REFUSED and blocks."""
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0)
    forever = threading.Event()

    def refuse_exit(code: int) -> None:
        leave_pid(EXIT_REFUSED)
        forever.wait()

    # The control thread looks up os._exit when its pipe closes: make that call block instead.
    patched = types.ModuleType("os")
    patched.__dict__.update(os.__dict__)
    patched._exit = refuse_exit  # type: ignore[attr-defined]
    tether.os = patched  # type: ignore[attr-defined]
    return stubborn()  # blocks in an LLM call (once recorded), writing nothing that could fail on a dead pipe


registry = {**one_registry, "immortal": immortal}

__all__ = ["EXIT_REFUSED", "eval_llms", "registry"]
