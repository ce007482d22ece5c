"""A streamed chunk's data: the fast path for plain text chunks gives exactly what the generic one does."""

from __future__ import annotations

import subprocess
import sys

import orjson

from tests.conftest import ROOT

# Run apart, so this test process never imports CrewAI (seconds, and telemetry switches to set first).
PROGRAM = """
import orjson
from protocol import QUIET_CREWAI
import os
os.environ.update(QUIET_CREWAI)
from crewai.types.streaming import StreamChunk, StreamChunkType, ToolCallChunk
from worker.operations import _text_chunk, chunk_message, to_json

text = StreamChunk(content="hé\\u2028llo", task_index=2, task_name="t", task_id="id", agent_role="r", agent_id="a")
tool = StreamChunk(
    content="", chunk_type=StreamChunkType.TOOL_CALL,
    tool_call=ToolCallChunk(tool_id="x", tool_name="search", arguments='{"q": 1}', index=0),
)
print(orjson.dumps([
    [chunk_message(c).data, {**to_json(c), "channel": chunk_message(c).channel}, _text_chunk(c) is not None]
    for c in (text, tool)
]).decode())
"""


def test_a_text_chunk_read_off_its_fields_equals_its_model_dump() -> None:
    done = subprocess.run([sys.executable, "-c", PROGRAM], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    (text_fast, text_generic, text_took_fast_path), (tool_fast, tool_generic, tool_took_fast_path) = orjson.loads(
        done.stdout.rstrip("\n").split("\n")[-1]  # not splitlines(): the content holds U+2028
    )
    assert text_took_fast_path and not tool_took_fast_path
    assert text_fast == text_generic and list(text_fast) == list(text_generic)  # same keys, same order
    assert text_fast["channel"] == "llm" and text_fast["chunk_type"] == "text"
    assert tool_fast == tool_generic and tool_fast["channel"] == "tools"
