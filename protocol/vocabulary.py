"""The names both sides of the pipe share: the operations a job runs, defined here once.

A ``StrEnum`` member equals its name as text, so each side compares and keys by these members while the frames,
the journal and the HTTP contract keep carrying the plain names.
"""

from __future__ import annotations

import enum


class Operation(enum.StrEnum):
    """An operation a job runs on its crew, in the reference's order (``ALLOWED_OPERATIONS``, ``--operation``)."""

    RUN = "run"
    BATCH_RUN = "batch_run"
    REPLAY = "replay"
    TRAIN = "train"
    TEST = "test"
    KNOWLEDGE_QUERY = "knowledge_query"
    MEMORY_RESET = "memory_reset"


# Operations without external effects: when one fails, its outcome is certain (as the reference says).
READ_ONLY_OPERATIONS = frozenset({Operation.KNOWLEDGE_QUERY})
