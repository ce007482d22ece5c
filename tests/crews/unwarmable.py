"""A registry that changes CrewAI's event bus the way a new release might, so warming cannot quiesce it.

``UNWARMABLE=renamed``: the bus keeps its loop thread under another name (an attribute warming relies on
is missing). ``UNWARMABLE=stuck``: the first emit also starts a thread that never ends. Either way warming
must refuse in one line: the fork server's test shows ``renamed`` (tests/supervisor/processes/test_forkserver.py), the
doctor's warm-up check ``stuck`` (tests/supervisor/doctor/test_doctor.py). Apart because it breaks the
fork server's warm-up by design.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from crewai.events.event_bus import CrewAIEventsBus

from tests.crews import eval_llms, registry

_initialise = CrewAIEventsBus._ensure_executor_initialized


def _renamed(self: Any) -> None:
    _initialise(self)
    if hasattr(self, "_loop_thread"):
        self._events_thread = self.__dict__.pop("_loop_thread")


def _stuck(self: Any) -> None:
    if not self._executor_initialized:
        threading.Thread(target=time.sleep, args=(3600,), name="never-ending", daemon=True).start()
    _initialise(self)


_MODES = {"renamed": _renamed, "stuck": _stuck}
CrewAIEventsBus._ensure_executor_initialized = _MODES[os.environ.get("UNWARMABLE", "renamed")]  # type: ignore[method-assign]

__all__ = ["eval_llms", "registry"]
