"""CrewAI's file locks, kept with the crew's storage.

CrewAI guards the files a crew shares across processes (its kickoff outputs, its ChromaDB, its HOME's files)
with lock files in the temporary directory (``crewai_core.lock_store``). A job's TMPDIR is its own, removed when
it ends, so there the lock would hold against no other job of its crew; in the crew's storage it holds against
them all, and no job of another crew (which shares none of those files) can reach it. Where ``REDIS_URL`` is set,
CrewAI's Redis locks are left to it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from hashlib import md5
from typing import Any

LOCKS = "locks"  # beneath CREWAI_STORAGE_DIR


def keep_with_storage() -> None:
    """CrewAI's locks of this process go to ``$CREWAI_STORAGE_DIR/locks`` (made here, 0700), if it has one."""
    storage = os.environ.get("CREWAI_STORAGE_DIR")
    if not storage or os.environ.get("REDIS_URL"):
        return
    from crewai_core import lock_store  # after the environment is the job's: CrewAI reads it when imported

    directory = os.path.join(storage, LOCKS)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    lock_store.set_lock_backend(_file_locks(directory))


def _file_locks(directory: str) -> Callable[..., AbstractContextManager[Any]]:
    import portalocker

    def lock(name: str, *, timeout: float) -> AbstractContextManager[Any]:
        channel = md5(name.encode(), usedforsecurity=False).hexdigest()
        return portalocker.Lock(os.path.join(directory, f"crewai:{channel}.lock"), timeout=timeout)

    return lock
