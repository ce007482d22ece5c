"""Every thread's Python stack, for the operator (``crew-supervisor stack``): taken by the thread that watches the
control pipe while the job goes on, so a crew blocked in a call (a provider, a tool, a lock) shows where.

Each call is its file, line and function, as faulthandler writes them, without the source line: reading a source
file lets go of the interpreter's lock, and beside a thread that spins in Python each read then waits its turn
(5 ms) to take it back, so a traceback's few dozen files could outlast what a stop waits for them (200 ms)."""

from __future__ import annotations

import sys
import threading
from types import FrameType

from protocol import MAX_NAME_CHARS, MAX_STACK_BYTES, STACK_CUT, Stacks, innermost


def take() -> Stacks:
    """Each thread but the caller's, the main thread first; a stack past what is left of MAX_STACK_BYTES keeps its
    innermost calls, where the thread is. A name (the crew's to choose) is cut to MAX_NAME_CHARS: a long one would
    make a frame no reader takes."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    main, caller = threading.main_thread().ident, threading.get_ident()
    frames = sorted(sys._current_frames().items(), key=lambda item: (item[0] != main, names.get(item[0], "")))
    threads, left = [], MAX_STACK_BYTES
    for ident, frame in frames:
        if ident == caller or left <= len(STACK_CUT):
            continue
        stack = innermost(_calls(frame), left)
        name = names.get(ident, "(not started by threading)")[:MAX_NAME_CHARS]
        threads.append({"name": name, "ident": ident, "stack": stack})
        left -= len(stack.encode())
    return Stacks(threads=threads)


def _calls(frame: FrameType | None) -> str:
    """The calls that led to ``frame``, outermost first, as a traceback lists them."""
    calls = []
    while frame is not None:
        calls.append(f'  File "{frame.f_code.co_filename}", line {frame.f_lineno}, in {frame.f_code.co_name}\n')
        frame = frame.f_back
    return "".join(reversed(calls))
