"""Admission: validate, fence, admit. A start is checked in the reference's order, fenced by its request
hash, and made durable before any work; each refusal is a typed error.

No HTTP here: the app answers each kind of ``Refused`` with its status.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from supervisor.config import Settings
from supervisor.journal.store import Job, Journal, JournalError
from supervisor.models import InputError, StartRequest, input_too_large, key_problem, request_hash, validate_input


class Refused(Exception):
    """A start the contract refuses; the HTTP side answers each kind with the reference's status."""


class ShuttingDown(Refused):
    """The supervisor is draining."""


class InputTooLarge(Refused):
    """Input over 1 MiB of compact JSON."""


class WrongRoute(Refused):
    """A legacy ``/runs`` route asked for another operation than ``run``."""


class OperationDisabled(Refused):
    """The operation is not in ``ALLOWED_OPERATIONS``."""


class KeyMissing(Refused):
    """No Idempotency-Key, or a blank one."""


class KeyInvalid(Refused):
    """An Idempotency-Key too long or with control characters."""


class InputInvalid(Refused):
    """The operation's input breaks its schema."""


class CrewNotFound(Refused):
    """No such crew in the registry."""


class ConflictingReuse(Refused):
    """The action id was admitted with other request material."""


class JournalFull(Refused):
    """The journal holds its limit of jobs or bytes, or could not make the admission durable."""


Launch = Callable[[Job, dict[str, Any], int], None]


class Admission:
    def __init__(self, settings: Settings, journal: Journal, crews: list[str], launch: Launch) -> None:
        self.settings = settings
        self.journal = journal
        self.crews = crews
        self.launch = launch
        self.stopped = False  # no new starts once the supervisor drains

    def stop(self) -> None:
        self.stopped = True

    def admit(self, body: StartRequest, key: str | None, legacy: bool) -> Job:
        """The reference's order (413, 400, 403, 428/400, 422, 404, 409, 507); an exact repeat returns its
        job even if its operation was disabled since. Synchronous, so no other start interleaves."""
        if self.stopped:
            raise ShuttingDown("the supervisor is shutting down")
        if input_too_large(body):
            raise InputTooLarge("input exceeds 1 MiB")
        if legacy and body.operation != "run":
            raise WrongRoute("this route starts only the run operation")
        bad_key = key_problem(key)
        digest = request_hash(body, key) if bad_key is None and key is not None else ""
        existing = self.journal.get(body.action_id)
        if existing is not None and existing.request_hash == digest:
            return existing
        if body.operation not in self.settings.allowed_operations:
            raise OperationDisabled(f"operation {body.operation} is not allowed")
        if bad_key is not None:
            missing, problem = bad_key
            raise (KeyMissing if missing else KeyInvalid)(problem)
        try:
            operation_input = validate_input(body)
        except InputError as exc:
            raise InputInvalid(str(exc)) from None
        if body.crew_id not in self.crews:
            raise CrewNotFound("crew was not found")
        if existing is not None:
            raise ConflictingReuse("action id was already admitted with different request material")
        if self.journal.count() >= self.settings.max_retained_runs:
            raise JournalFull("journal holds the maximum number of retained runs; archive some")
        if self.journal.size_bytes() >= self.settings.max_state_bytes:
            raise JournalFull("journal has reached its byte limit; archive some runs")
        job = Job(body.action_id, body.crew_id, body.operation, digest, "running", 0)
        try:
            self.journal.admit(job)  # the start fence: durable before any worker exists
        except JournalError as exc:
            raise JournalFull(f"admission could not be made durable: {exc}") from None
        self.launch(job, operation_input, body.timeout_ms)
        return job
