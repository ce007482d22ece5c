"""The parts every live job uses, wired once by the supervisor: each job holds the one ``Parts``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

from supervisor.config import Settings
from supervisor.enums import Lifecycle
from supervisor.jobs.budget import Budget
from supervisor.jobs.crew_disk import CrewDisk
from supervisor.jobs.recorder import Recorder
from supervisor.jobs.sandbox import Sandbox
from supervisor.jobs.slots import Slots
from supervisor.metrics import Metrics
from supervisor.processes.launcher import Launcher
from supervisor.processes.limits import Limits


@dataclasses.dataclass(frozen=True)
class Parts:
    settings: Settings
    state: Path  # the state directory: the jobs' places are under it
    launcher: Launcher
    limits: Limits
    sandbox: Sandbox
    recorder: Recorder
    metrics: Metrics
    slots: Slots  # taken in turn between crews
    crew_disk: CrewDisk  # each crew's places as its jobs measure them, for admission
    tokens: Callable[[], Collection[str]]  # every role's bearer tokens now (supervisor/tokens.py): kept from workers
    lifecycle: Callable[[], Lifecycle]  # the supervisor's, which it alone sets
    budget: Budget  # the supervisor's LLM budget per job
    budgets: Mapping[str, Budget]  # each crew's own, as its registry entry asks (Registry.budgets)

    @property
    def grace(self) -> float:
        """Seconds a stopped worker gets to leave before its kill (``STOP_GRACE_MS``)."""
        return self.settings.stop_grace_ms / 1000

    def budget_of(self, crew_id: str) -> Budget:
        """What a job of ``crew_id`` may spend: the supervisor's budget, or its crew's own where that is lower."""
        return self.budget.within(self.budgets.get(crew_id, Budget()))

    def crew_budgets(self) -> dict[str, dict[str, int]]:
        """Each crew's own budget that holds (what its registry entry asks, read as counts), for ``/health``."""
        return {crew_id: dataclasses.asdict(own) for crew_id, own in self.budgets.items() if own != Budget()}
