"""The pipe between supervisor and worker: length-prefixed orjson frames and their messages.

Pure Python plus orjson; imports nothing else from this project.
"""

from protocol.frames import (
    MAX_FRAME_BYTES,
    FrameError,
    FrameReader,
    FrameTooLarge,
    InvalidDocument,
    TruncatedFrame,
    encode,
)
from protocol.messages import (
    PROTOCOL_VERSION,
    TERMINAL,
    Chunk,
    Completed,
    Failed,
    Hello,
    Message,
    MessageReader,
    Registry,
    Start,
    Started,
    Stop,
    UnknownMessage,
    VersionMismatch,
    decode,
    pack,
)

__all__ = [
    "MAX_FRAME_BYTES",
    "PROTOCOL_VERSION",
    "TERMINAL",
    "Chunk",
    "Completed",
    "Failed",
    "FrameError",
    "FrameReader",
    "FrameTooLarge",
    "Hello",
    "InvalidDocument",
    "Message",
    "MessageReader",
    "Registry",
    "Start",
    "Started",
    "Stop",
    "TruncatedFrame",
    "UnknownMessage",
    "VersionMismatch",
    "decode",
    "encode",
    "pack",
]
