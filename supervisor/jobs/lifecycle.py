"""The supervisor's own lifecycle, from ``Supervisor.open`` to the end of its ``stop``: set by the ``Supervisor``
alone, read by admission (whether a start is admitted), the runner (how a job admitted late ends) and ``/health``."""

from __future__ import annotations

import enum


class Lifecycle(enum.StrEnum):
    OPENING = "opening"  # its parts coming up: nothing listens yet
    OPEN = "open"  # serving: starts are admitted
    CLOSING = "closing"  # no new starts (503); the admissions under way are made durable and launched
    DRAINING = "draining"  # the queue closed: queued jobs fail, certain; running ones get DRAIN_SECONDS
    STOPPING = "stopping"  # every job left is killed, then the services stop
    STOPPED = "stopped"

    @property
    def admits(self) -> bool:
        """New starts are admitted (``/health`` says ``ready``); from a drain's or a stop's start, they answer 503."""
        return self in (Lifecycle.OPENING, Lifecycle.OPEN)

    @property
    def queue_closed(self) -> bool:
        """No queued job starts: one admitted now ends at once, as those queued did."""
        return self in (Lifecycle.DRAINING, Lifecycle.STOPPING, Lifecycle.STOPPED)

    @property
    def stopping(self) -> bool:
        """Every job ends now, killed if it runs."""
        return self in (Lifecycle.STOPPING, Lifecycle.STOPPED)
