"""The one registry, and an import that starts a thread: a fork server that loads it must refuse to fork.

Apart because it breaks the fork server by design."""

from __future__ import annotations

import threading
import time

from tests.crews import eval_llms, registry

threading.Thread(target=time.sleep, args=(3600,), name="import-time thread", daemon=True).start()

__all__ = ["eval_llms", "registry"]
