"""A worker's frames leave it whole: the last one another thread is writing ends before the process may exit."""

from __future__ import annotations

import os
import threading

import pytest

from protocol import Completed, MessageReader, Stacks
from worker.tether import FrameWriter


def test_close_waits_for_the_frame_another_thread_is_writing_and_lets_no_other_begin() -> None:
    read_end, write_end = os.pipe()
    try:
        out = FrameWriter(write_end)
        out.send(Completed(output={"raw": "done"}))  # the job's terminal frame, then the control thread's answer:
        answer = Stacks(threads=[{"name": "MainThread", "ident": 1, "stack": "x" * 300_000}])  # past a pipe's room
        writing = threading.Thread(target=out.send, args=(answer,))
        writing.start()
        closed = threading.Event()
        closing = threading.Thread(target=lambda: (out.close(), closed.set()))
        closing.start()
        closing.join(0.2)
        assert not closed.is_set()  # the answer is half written: the process may not exit yet
        reader, messages = MessageReader(), []
        while len(messages) < 2:
            messages += reader.feed(os.read(read_end, 65536))
        assert messages == [Completed(output={"raw": "done"}), answer] and not reader.inside_frame
        closing.join(5)
        assert closed.is_set()
        late = threading.Thread(target=out.send, args=(answer,), daemon=True)  # what comes after: never begun
        late.start()
        late.join(0.2)
        assert late.is_alive()
        os.set_blocking(read_end, False)
        with pytest.raises(BlockingIOError):  # not a byte of it written
            os.read(read_end, 65536)
    finally:
        os.close(read_end)
        os.close(write_end)
