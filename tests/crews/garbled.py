"""The one registry, whose import in a fork server writes a frame that is no frame on the fork server's socket while
the file ``GARBLE_FORKSERVER`` names exists: the supervisor reads it as the fork server's first word, as it would a
fork server that broke at start. Workers (spawned cold, or forked) import it as any registry. Apart because it breaks
a fork server's start by design."""

import os
import struct
import sys

from protocol import CONTROL_FD
from tests.crews import registry

if sys.argv[1:2] == ["forkserver"] and os.path.exists(os.environ.get("GARBLE_FORKSERVER", "/nonexistent")):
    os.write(CONTROL_FD, struct.pack(">I", 9) + b"not json!")  # the fork server's socket is its control fd

__all__ = ["registry"]
