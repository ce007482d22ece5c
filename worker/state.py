"""What one worker process holds: one ``WorkerState``, made at ``python -m worker``'s start (for a cold worker, a
describing or checking one, and the fork server), or by the fork server for each worker it forks (its own, with the
settings of the worker's environment), and passed to what needs it.

What CrewAI calls back into (the ledger's and the trace's wrapped methods, the spending's wrapped booking and its
before-call hook, ``ssl.create_default_context`` for the TLS pool) is made holding the part of the state it needs:
no module of the worker keeps a process's state. One job a process, so a class CrewAI defines is wrapped once.
"""

from __future__ import annotations

import dataclasses

from protocol import WorkerSettings
from worker.ledger import Ledger
from worker.spending import Spending
from worker.tether import Confinement
from worker.tls import Pool
from worker.tracing import Trace


@dataclasses.dataclass
class WorkerState:
    """This process's: the supervisor's ``settings`` (out of its environment: ``tether.take_settings``, again from a
    job's environment), its ``confinement``, the fork server's TLS ``pool`` (its workers' too), and its job's
    ``trace`` (when its Start names one), ``ledger`` and ``spending`` once opened."""

    settings: WorkerSettings
    confinement: Confinement = dataclasses.field(default_factory=Confinement)
    pool: Pool | None = None
    trace: Trace | None = None
    ledger: Ledger | None = None
    spending: Spending | None = None

    def recorded(self, entry: int) -> bool:
        """The control thread's ``Recorded(entry)``: the thread waiting on it goes on. False: nobody waits for it."""
        return self.ledger is not None and self.ledger.recorded(entry)
