"""The test registry plus crews that push the supervisor's limits or play an orphan.

``AIP_CREWAI_REGISTRY=tests.hostile_crews:registry``."""

from __future__ import annotations

import ctypes
import os
import threading
import types
from typing import Any

from crewai import Crew
from crewai.events.types.llm_events import LLMCallType
from crewai.llms.base_llm import llm_call_context

from tests.crews import _single, stubborn
from tests.crews import registry as base_registry
from worker import lifecycle
from worker.demo import OfflineLLM

PR_SET_PDEATHSIG = 1


class SizedLLM(OfflineLLM):
    """Streams one chunk of ``chunk_bytes`` and answers ``answer_bytes``: to meet the byte limits."""

    chunk_bytes: int = 0
    answer_bytes: int = 0

    def call(self, messages: Any, *args: Any, from_task: Any = None, from_agent: Any = None, **kwargs: Any) -> str:
        if self.chunk_bytes and self._effective_stream():
            with llm_call_context():
                self._emit_stream_chunk_event(
                    chunk="c" * self.chunk_bytes,
                    from_task=from_task,
                    from_agent=from_agent,
                    call_type=LLMCallType.LLM_CALL,
                    response_id="sized",
                )
        return "Thought: done\nFinal Answer: " + "a" * self.answer_bytes


def big_chunk() -> Crew:
    return _single(SizedLLM(model="sized", chunk_bytes=4096))


def big_output() -> Crew:
    return _single(SizedLLM(model="sized", answer_bytes=700 * 1024))


def immortal() -> Crew:
    """Disarms the worker's own ways of dying with its supervisor: only restart fencing stops it."""
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0)
    forever = threading.Event()
    # The control thread looks up os._exit when its pipe closes: make that call block instead.
    patched = types.ModuleType("os")
    patched.__dict__.update(os.__dict__)
    patched._exit = lambda code: forever.wait()  # type: ignore[attr-defined]
    lifecycle.os = patched  # type: ignore[attr-defined]
    return stubborn()  # blocks in an LLM call, writing nothing that could fail on a dead pipe


registry = {**base_registry, "immortal": immortal, "big-chunk": big_chunk, "big-output": big_output}
