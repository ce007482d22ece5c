"""Where a ``train`` job writes its artifact before publishing it: a name both sides compute.

The worker writes the artifact into a hidden file beside its final name and renames it into place, so
readers see the whole artifact or none. A worker killed before the rename leaves that file; the
supervisor, knowing the job's action id and artifact name, removes exactly it once the worker is gone.
"""

from __future__ import annotations

import hashlib

PARTIAL_SUFFIX = ".partial"


def partial_name(artifact_name: str, job_id: str) -> str:
    """One name per job (``job_id`` is its action id, which may hold any character but ``/`` and controls,
    so it goes in hashed)."""
    return f".{artifact_name}.{hashlib.sha256(job_id.encode()).hexdigest()[:32]}{PARTIAL_SUFFIX}"


def is_partial(name: str) -> bool:
    """Whether a file name in the training directory is one of these (or an older supervisor's)."""
    return name.startswith(".") and name.endswith(PARTIAL_SUFFIX)
