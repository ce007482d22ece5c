"""Every thread's Python stack, for the operator (``crew-supervisor stack``): taken by the thread that watches the
control pipe while the job goes on, so a crew blocked in a call (a provider, a tool, a lock) shows where.

Each call is its file, line and function, as faulthandler writes them, without the source line: reading a source
file lets go of the interpreter's lock, and beside a thread that spins in Python each read then waits its turn
(5 ms) to take it back, so a traceback's few dozen files could outlast what a stop waits for them (200 ms)."""

from __future__ import annotations

import sys
import threading
from types import FrameType

from protocol import Stacks, bounded_threads


def take() -> Stacks:
    """Each thread but the caller's, the main thread first, within the bounds of a ``Stacks``
    (``protocol.bounded_threads``)."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    main, caller = threading.main_thread().ident, threading.get_ident()
    frames = sorted(sys._current_frames().items(), key=lambda item: (item[0] != main, names.get(item[0], "")))
    return Stacks(
        threads=bounded_threads(
            (names.get(ident, "(not started by threading)"), ident, _calls(frame))
            for ident, frame in frames
            if ident != caller
        )
    )


def _calls(frame: FrameType | None) -> str:
    """The calls that led to ``frame``, outermost first, as a traceback lists them."""
    calls = []
    while frame is not None:
        calls.append(f'  File "{frame.f_code.co_filename}", line {frame.f_lineno}, in {frame.f_code.co_name}\n')
        frame = frame.f_back
    return "".join(reversed(calls))
