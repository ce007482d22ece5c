"""The roster: the jobs live here (admitted, no terminal event committed yet), by action id, oldest first. The runner
adds each job as it is admitted; the job leaves it once its terminal event has committed; the rest only read it."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Generic, Protocol, TypeVar

from protocol import Operation
from supervisor.enums import STOPPABLE_PHASES, Phase
from supervisor.jobs.job_state import JobState


class Member(JobState, Protocol):
    """What the roster reads of a job (``LiveJob``, which it cannot name: the job holds the roster): its state, and
    whom to wake when its events commit."""

    def wake(self) -> None: ...


Job = TypeVar("Job", bound=Member)


class Roster(Generic[Job]):
    def __init__(self) -> None:
        # In the order they were admitted: a job joins as it is admitted, at the loop's time then.
        self._jobs: dict[str, Job] = {}

    def add(self, job: Job) -> None:
        self._jobs[job.action_id] = job

    def remove(self, action_id: str) -> None:
        self._jobs.pop(action_id, None)

    def get(self, action_id: str) -> Job | None:
        return self._jobs.get(action_id)

    def __contains__(self, action_id: object) -> bool:
        return action_id in self._jobs

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[Job]:
        """Oldest first; a copy: a job may leave while its reader awaits."""
        return iter(list(self._jobs.values()))

    def count(self, *phases: Phase) -> int:
        """How many live jobs are in one of ``phases`` (the gauges)."""
        return sum(job.phase in phases for job in self._jobs.values())

    def in_phase(self, phase: Phase) -> list[str]:
        """The action ids of the live jobs in ``phase`` (a listing's filter)."""
        return [job.action_id for job in self._jobs.values() if job.phase is phase]

    def stoppable(self, crew_id: str | None, phase: Phase | None, operation: Operation | None) -> list[Job]:
        """The live jobs a stop may still be asked of, of ``crew_id``, in ``phase``, of ``operation`` (None: any),
        oldest first."""
        return [
            job
            for job in self._jobs.values()
            if job.phase in STOPPABLE_PHASES
            and (crew_id is None or job.crew_id == crew_id)
            and (phase is None or job.phase == phase)
            and (operation is None or job.operation == operation)
        ]

    def wake(self, action_ids: Iterable[str]) -> None:
        """Readers see only committed events: after each commit, the followers of jobs with newly committed events
        look again. Only those: hundreds of streams must not all query the journal on every commit."""
        for action_id in action_ids:
            if (job := self._jobs.get(action_id)) is not None:
                job.wake()
