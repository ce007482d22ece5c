"""A fake worker that breaks the protocol in one chosen way: ``python hostile_worker.py MODE <launcher args>``."""

from __future__ import annotations

import argparse
import os
import struct
import sys
import time

from protocol import EVENT_FD, PROTOCOL_VERSION

parser = argparse.ArgumentParser()
parser.add_argument(
    "behaviour", choices=["garbage", "oversized", "truncated", "not-json", "unknown-type", "old-version"]
)
parser.add_argument("mode")
parser.add_argument("--parent-pid", type=int)
parser.add_argument("--cwd")
args = parser.parse_args()


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


payloads = {
    "garbage": b"\x00\x00\x00\x05hello-not-a-frame" * 3,
    "oversized": struct.pack(">I", 2**31) + b"{}",
    "truncated": struct.pack(">I", 100) + b'{"v": %d' % PROTOCOL_VERSION,
    "not-json": frame(b"nope"),
    "unknown-type": frame(b'{"v":%d,"type":"launch"}' % PROTOCOL_VERSION),
    "old-version": frame(b'{"v":0,"type":"hello","pid":1}'),
}
os.write(EVENT_FD, payloads[args.behaviour])
if args.behaviour == "truncated":
    os.close(EVENT_FD)
time.sleep(3600 if args.behaviour != "truncated" else 0)
sys.exit(0)
