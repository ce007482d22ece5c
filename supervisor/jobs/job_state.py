"""A live job as the parts it uses see it (``JobState``): its conversation, its launch, its ledger, the recorder, its
stacks and its outcome read it, and ask it only to lap a step or to stop. ``LiveJob`` (``live.py``) is the one
that meets it; it is named here, below them, so that none of them imports the job that holds them."""

from __future__ import annotations

from typing import Any, Protocol

from protocol import Operation
from supervisor.enums import Phase
from supervisor.jobs.budget import Budget, Spending
from supervisor.jobs.phases import StopReason
from supervisor.jobs.tracing import JobTrace
from supervisor.journal.records import TaskRecord
from supervisor.processes.limits import Breach
from supervisor.processes.process import WorkerProcess


class JobState(Protocol):
    @property
    def action_id(self) -> str: ...

    @property
    def crew_id(self) -> str: ...

    @property
    def operation(self) -> Operation: ...

    @property
    def input(self) -> dict[str, Any]: ...

    @property
    def timeout_ms(self) -> int: ...

    @property
    def admitted(self) -> float:
        """Loop time."""

    @property
    def resumed(self) -> list[TaskRecord] | None:
        """A resume's tasks its earlier job completed."""

    @property
    def budget(self) -> Budget: ...

    @property
    def trace(self) -> JobTrace: ...

    @property
    def phase(self) -> Phase: ...

    @property
    def stop(self) -> StopReason | None: ...

    @property
    def cancel_reason(self) -> str | None: ...

    @property
    def breach(self) -> Breach | None: ...

    @property
    def worker(self) -> WorkerProcess | None: ...

    @property
    def secrets(self) -> tuple[str, ...]: ...

    @property
    def spent(self) -> Spending: ...

    def lap(self, step: str) -> None:
        """``step`` of its time ends now."""

    def ask_stop(self, reason: StopReason, said: str | None = None, breach: Breach | None = None) -> bool:
        """Whether this reason stops it: the first asked does, unless its outcome is already decided."""
