"""One job's effect ledger as its worker tells it (``EffectStarted``, ``EffectEnded``, ``TaskDone``): each frame is
crew code talking, so each is checked (ids in order, an end only for a call running, a task only of a ``run``, in
order), bounded and masked before the journal takes it (``journal/ledger.py``); a frame that breaks the protocol is
the job's protocol fault, as any other. A call's start and a completed task are answered ``Recorded`` once their
commit is durable, never before: the worker's thread waits for it before the call goes out (or the next task
starts). The conversation's loop waits for a task's commit, as for a chunk checkpoint (a task's output is large: a
worker that does not wait for its answer must not queue them in the writer), not for a call's start (small, bounded). A
job's task outputs, its earlier job's included, fit a resume's ``Start`` (``MAX_RESUMED_BYTES``): a faithful worker
never sends more. An entry past ``MAX_EFFECTS`` is neither recorded nor answered: the job is stopped as over any
other limit."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import orjson

from protocol import (
    MAX_EFFECT_ERROR_CHARS,
    MAX_EFFECT_NAME_CHARS,
    MAX_RESUMED_BYTES,
    Effect,
    EffectEnded,
    EffectStarted,
    EffectStatus,
    Operation,
    Reason,
    TaskDone,
)
from supervisor.config import PREFIX, Settings
from supervisor.jobs.job_state import JobState
from supervisor.jobs.recorder import masked
from supervisor.journal.ledger import Ending, Entry, LedgerWrites
from supervisor.journal.writer import Written
from supervisor.metrics import Metrics
from supervisor.processes.limits import Breach
from supervisor.redaction import redact

MAX_DIGEST_CHARS = 128  # a SHA-256 in hex is 64; room for a prefix naming the hash, none for anything else
ENDED = (EffectStatus.FINISHED, EffectStatus.FAILED)  # what a worker may say of a call's end
LedgerFrame = EffectStarted | EffectEnded | TaskDone
Fault = tuple[Reason, str]  # a protocol fault: its reason and message


class Ledger:
    def __init__(
        self,
        job: JobState,
        settings: Settings,
        metrics: Metrics,
        writes: LedgerWrites,
        answer: Callable[[int], None],
        breach: Callable[[Breach], None],
    ) -> None:
        """``answer``: tells the worker an entry is recorded (its conversation's, which speaks to the worker);
        ``breach``: stops the job as over a limit (``Conversation.breach``)."""
        self.job, self.settings, self.metrics, self.writes, self.answer = job, settings, metrics, writes, answer
        self.breach = breach
        self.last = 0  # the id of the last entry taken (calls and tasks share the count)
        self.running: dict[int, Effect] = {}  # the calls started and not ended, and their kinds
        # The index the next TaskDone must have: a resume's first is the first task its earlier job did not complete.
        self.next_task = len(job.resumed or ())
        # The bytes its task outputs take as stored, the earlier job's too: what a resume of this job carries.
        self.task_bytes = sum(len(orjson.dumps(task.output)) for task in job.resumed or ())
        self.full = False  # an entry came past MAX_EFFECTS: the job is stopping, nothing more is taken

    async def take(self, message: LedgerFrame) -> Fault | None:
        """Record one ledger frame, or say the fault it is; a completed task, once durable (or failed)."""
        if isinstance(message, EffectEnded):
            return self._end(message)
        if self.full:  # the worker's other threads may still talk until the kill: nothing of theirs is kept
            return None
        if message.id != self.last + 1:
            return Reason.PROTOCOL_ERROR, f"ledger entry {message.id} out of order: expected {self.last + 1}"
        if message.id > (limit := self.settings.max_effects):
            self.full = True
            text = f"the job's ledger holds {limit} entries, {PREFIX}MAX_EFFECTS: its next call never started"
            self.breach(Breach(Reason.EFFECT_LIMIT_EXCEEDED, text, {"limit": limit}))
            return None
        if isinstance(message, EffectStarted):
            return self._start(message)
        return await self._task(message)

    def cut_off(self) -> None:
        """The worker is heard no more: each call still running is counted uncertain, as the job's end records it."""
        for kind in self.running.values():
            self._count(kind, EffectStatus.UNCERTAIN)
        self.running.clear()

    def _count(self, kind: Effect, status: EffectStatus) -> None:
        self.metrics.effects.labels(self.job.crew_id, kind, status).inc()

    def _start(self, message: EffectStarted) -> Fault | None:
        if message.effect not in tuple(Effect):
            return Reason.PROTOCOL_ERROR, f"ledger entry {message.id}: no such effect {message.effect[:20]!r}"
        if len(message.name) > MAX_EFFECT_NAME_CHARS or len(message.digest) > MAX_DIGEST_CHARS:
            return Reason.PROTOCOL_ERROR, f"ledger entry {message.id}: a name or digest over its bound"
        secrets = self.job.secrets
        entry = Entry(message.id, message.effect, redact(message.name, secrets), redact(message.digest, secrets))
        self.last = message.id
        self.running[message.id] = Effect(message.effect)  # one of them, checked above
        self._answer(self.writes.start(self.job.action_id, entry), message.id)
        return None

    def _end(self, message: EffectEnded) -> Fault | None:
        if message.id not in self.running:
            return Reason.PROTOCOL_ERROR, f"ledger entry {message.id} ended, but no such call is running"
        if message.status not in ENDED:
            return Reason.PROTOCOL_ERROR, f"ledger entry {message.id}: a call ends finished or failed"
        if len(message.error_type) > MAX_EFFECT_NAME_CHARS or len(message.error_message) > MAX_EFFECT_ERROR_CHARS:
            return Reason.PROTOCOL_ERROR, f"ledger entry {message.id}: an error over its bound"
        if message.prompt_tokens < 0 or message.completion_tokens < 0:
            return Reason.PROTOCOL_ERROR, f"ledger entry {message.id}: a negative count of tokens"
        self._count(self.running.pop(message.id), EffectStatus(message.status))  # finished or failed, checked
        secrets = self.job.secrets
        error = (redact(message.error_type, secrets) or None, redact(message.error_message, secrets) or None)
        ending = Ending(message.id, message.status, *error, message.prompt_tokens, message.completion_tokens)
        self.writes.end(self.job.action_id, ending)
        return None

    async def _task(self, message: TaskDone) -> Fault | None:
        if self.job.operation != Operation.RUN:
            return Reason.PROTOCOL_ERROR, f"a completed task in a {self.job.operation!r} job: only a run has them"
        if message.index != self.next_task:
            return Reason.PROTOCOL_ERROR, f"completed task {message.index} out of order: expected {self.next_task}"
        if len(message.fingerprint) > MAX_DIGEST_CHARS:
            return Reason.PROTOCOL_ERROR, f"ledger entry {message.id}: a fingerprint over its bound"
        output = masked(message.output, self.job.secrets)  # as the completed event's output is kept
        if len(output) > (bound := self.settings.max_event_bytes):
            return Reason.EVENT_TOO_LARGE, f"a task output of {len(output)} bytes: {PREFIX}MAX_EVENT_BYTES is {bound}"
        if self.task_bytes + len(output) > MAX_RESUMED_BYTES:
            text = f"completed task {message.index}: the job's task outputs would take over {MAX_RESUMED_BYTES} bytes"
            return Reason.PROTOCOL_ERROR, text
        self.last, self.next_task, self.task_bytes = message.id, message.index + 1, self.task_bytes + len(output)
        written = self.writes.task_done(self.job.action_id, message.index, message.fingerprint, output)
        await asyncio.wait((self._answer(written, message.id),))  # answered, or the job stopped: either way, on
        return None

    def _answer(self, written: Written[None], entry: int) -> asyncio.Future[None]:
        """Answer ``entry`` (``Recorded``) once its commit is durable, in commit order (the writer resolves its writes
        in the order they were queued, and the loop runs the callbacks in the order they were resolved). A write the
        journal failed is never answered: the worker would wait on; the job is stopped instead."""

        def durable(done: asyncio.Future[None]) -> None:
            if done.cancelled():
                return
            if (exc := done.exception()) is not None:
                text = f"ledger entry {entry} could not be made durable: {exc}"
                self.breach(Breach(Reason.JOURNAL_ERROR, text, {"entry": entry}))
                return
            self.answer(entry)

        done = asyncio.wrap_future(written.future)
        done.add_done_callback(durable)
        return done
