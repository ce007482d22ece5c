"""Where CrewAI keeps a crew's files in a job: in the crew's own HOME and storage, which its sandbox lets it change.

- **Paths computed at import.** A few CrewAI modules compute a path from HOME or CREWAI_STORAGE_DIR when they are
  imported (ChromaDB's and Qdrant's default storage, the skills cache): in a forked worker that was the fork
  server's environment, so every crew's knowledge base would land in the fork server's storage, which no job's
  sandbox lets it change. They are computed again in the job (``follow_job``).
- **Lock files.** CrewAI guards the files a crew shares across processes (its kickoff outputs, its ChromaDB) with
  lock files in the temporary directory (``crewai_core.lock_store``). A job's TMPDIR is its own, removed when it
  ends, so there a lock would hold against no other job of its crew; in the crew's storage it holds against them
  all, and no job of another crew (which shares none of those files) can reach it. They are waited for in the
  kernel (``worker/locks.py``). Where ``REDIS_URL`` is set, CrewAI's Redis locks are left to it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from worker import locks

LOCKS = "locks"  # beneath CREWAI_STORAGE_DIR


# (module, attribute, which of ``follow_job``'s paths it holds): each was computed when the module was imported.
COMPUTED_AT_IMPORT = (
    ("crewai.rag.chromadb.constants", "DEFAULT_STORAGE_PATH", "storage"),
    ("crewai.rag.chromadb.config", "DEFAULT_STORAGE_PATH", "storage"),
    ("crewai.rag.qdrant.constants", "DEFAULT_STORAGE_PATH", "qdrant"),
    ("crewai.rag.qdrant.config", "DEFAULT_STORAGE_PATH", "qdrant"),
    ("crewai.skills.cache", "_CACHE_ROOT", "skills"),
)


def follow_job() -> None:
    """CrewAI's places follow the job's environment (a forked worker's modules were imported with the fork server's,
    or its warm-up's): each path computed again, once, as CrewAI computes it."""
    from crewai_core.paths import db_storage_path  # CrewAI's own rule: CREWAI_STORAGE_DIR, when absolute

    storage = db_storage_path()
    paths = {
        "storage": storage,
        "qdrant": os.path.join(storage, "qdrant"),
        "skills": Path.home() / ".crewai" / "skills",
    }
    for module_name, attribute, which in COMPUTED_AT_IMPORT:
        module = sys.modules.get(module_name)
        if module is not None and hasattr(module, attribute):
            setattr(module, attribute, paths[which])
    _keep_locks_with_storage(storage)


def _keep_locks_with_storage(storage: str) -> None:
    """CrewAI's locks of this process go to ``<storage>/locks`` (made here, 0700)."""
    if os.environ.get("REDIS_URL"):
        return
    from crewai_core import lock_store  # after the environment is the job's: CrewAI reads it when imported

    directory = os.path.join(storage, LOCKS)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    lock_store.set_lock_backend(locks.backend(directory))
