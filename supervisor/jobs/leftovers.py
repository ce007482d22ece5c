"""What a ``train`` job leaves half-written in the training directory when its worker dies before it
publishes (a kill, a crash, a supervisor that died with it): its hidden ``.partial`` file.

The name is the job's own (``protocol.partial_name``), so once the job's worker is gone its launch removes
exactly that file; at start-up, before any job runs, no ``.partial`` there belongs to anything alive.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from protocol import is_partial, partial_name

log = logging.getLogger("crew_supervisor.jobs")


def remove_partial(training_dir: str, artifact_name: str, action_id: str) -> None:
    """Only once the job's worker has exited: while it runs, the file is its work in progress."""
    if not training_dir:
        return
    with contextlib.suppress(FileNotFoundError):  # published (renamed), removed by the worker, or never opened
        os.unlink(Path(training_dir) / partial_name(artifact_name, action_id))
        log.info("removed the half-written artifact of a stopped train job", extra={"action_id": action_id})


def remove_stale_partials(training_dir: str) -> None:
    """At start-up, after restart fencing has killed what a dead supervisor left running. A link is removed,
    never followed; a directory is left alone."""
    if not training_dir:
        return
    removed = 0
    try:
        entries = os.scandir(training_dir)
    except OSError as exc:  # checked only where train is allowed: elsewhere it may not (or no longer) exist
        log.warning("cannot look for half-written training artifacts in %s: %s", training_dir, exc.strerror)
        return
    with entries:
        for entry in entries:
            if is_partial(entry.name) and not entry.is_dir(follow_symlinks=False):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                    removed += 1
    if removed:
        log.warning("removed %d half-written training artifact(s) left by jobs that did not finish", removed)
