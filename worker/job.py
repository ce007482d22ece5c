"""One job's life inside its worker: hello, registry, start, one operation, one terminal frame, exit.

Frames go only to the event fd; stdout and stderr belong to CrewAI's panels and are captured apart.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import functools
import os
import sys
import threading
import traceback
from typing import Any, NoReturn

from protocol import (
    READ_ONLY_OPERATIONS,
    Building,
    Built,
    Completed,
    Failed,
    Hello,
    Mode,
    Operation,
    Reason,
    Registry,
    SpanName,
    Start,
    Started,
)
from worker import landlock, ledger, places, registry, resume, spending, tether, tracing, warmup
from worker.operations import HANDLERS, OperationError, OutputTooLarge, Work, bounded
from worker.state import WorkerState

MAX_CHECK_ERROR_CHARS = 1000  # one line of the doctor's report, not a traceback


def run(
    state: WorkerState,
    event_fd: int,
    control_fd: int,
    crews: dict[str, Any] | None = None,
    mode: Mode = Mode.JOB,
    domain: landlock.Ruleset | None = None,
    only: str | None = None,
) -> NoReturn:
    """Serve one job, or (``mode``) describe the registry or also check that each crew builds (``only``: that crew
    alone, launched with its env file, the warm-up not rehearsed again); ``crews`` comes preloaded from a fork
    server, and ``domain`` (its job's sandbox) made ready ahead (``domain_ahead``)."""
    launched = dict(os.environ)  # what it was started (or forked) with, before imports add to it
    out = tether.FrameWriter(event_fd)
    control = tether.Control(control_fd, out, state.recorded)
    out.send(Hello(pid=os.getpid()))
    try:
        tether.prepare_environment()
        if crews is None:  # cold: watched while it imports, until its Start; a forked worker reads it itself
            control.watch()
            crews = load(state, out)
        if crews is not None and mode is not Mode.JOB:
            rehearsed = mode is Mode.CHECK and only is None
            warmed = rehearse_warmup(state, [control.thread] if control.thread else []) if rehearsed else None
            out.send(describe_registry(state, crews, warmed))
            if mode is Mode.CHECK:
                check({only: crews[only]} if only in crews else crews, out)
        elif crews is not None:
            enter_and_execute(state, control.start(), crews, out, launched, domain, control)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        out.close()
        # Interpreter teardown after CrewAI costs 1-1.5 s; the terminal frame is already written.
        os._exit(0)


def enter_and_execute(
    state: WorkerState,
    start: Start,
    crews: dict[str, Any],
    out: tether.FrameWriter,
    launched: dict[str, str],
    domain: landlock.Ruleset | None,
    control: tether.Control,
) -> None:
    """The job ``start``, in its sandbox, its control pipe watched from there."""
    if start.trace:  # not traced: nothing opened, nothing paid
        state.trace = tracing.open_trace(out.send, secrets_of(start))
    try:
        enter(state, start, launched, domain)
    except OSError as exc:  # never run a crew outside the sandbox it was given
        tracing.started(state.trace, type(exc).__name__)
        out.send(failed(type(exc).__name__, Reason.SANDBOX_FAILED, f"the job's sandbox: {exc}", False))
        return
    control.watch()  # in the job's domain
    # Not asyncio.run: its teardown would wait on threads CrewAI may leave blocked.
    asyncio.new_event_loop().run_until_complete(execute(state, start, crews, out))


def load(state: WorkerState, out: tether.FrameWriter) -> dict[str, Any] | None:
    """The registry, or None after telling the supervisor why it cannot be loaded."""
    spec = state.settings.registry
    try:
        return registry.load(spec)
    except Exception as exc:
        # Registry errors are configuration, so their text is safe and needed to fix startup.
        message = f"{spec}: {type(exc).__name__}: {exc}"
        out.send(failed(Reason.REGISTRY_ERROR, Reason.REGISTRY_ERROR, message, False))
        return None


def describe_registry(state: WorkerState, crews: dict[str, Any], warmed: dict[str, Any] | None = None) -> Registry:
    eval_llms = sorted(registry.eval_llms(state.settings.registry))
    budgets = spending.budgets(crews)
    confinement = state.confinement
    sandbox = list[str](confinement.offered)  # a frame's, which the supervisor reads as untrusted text
    return Registry(sorted(crews), eval_llms, warmed or {}, budgets, contained=confinement.contained, sandbox=sandbox)


def rehearse_warmup(state: WorkerState, ours: list[threading.Thread]) -> dict[str, Any]:
    """What a fork server's warm-up would warm here (``warmup.Warmth``), or ``refused``: why it would refuse.
    ``ours`` are this worker's own threads (its control pipe's), which a fork server does not have."""
    try:
        return dataclasses.asdict(warmup.warm(state, ours=ours))
    except warmup.WarmupError as exc:
        return {"refused": " ".join(str(exc).split())[:1000]}


def check(crews: dict[str, Any], out: tether.FrameWriter) -> None:
    """Build each crew once, as a job would, in the order the description lists them: one Built each.

    The error's text is sent, not only its class as a job's failure has it: this is configuration,
    read by the operator (``crew-supervisor doctor``), never stored with a job."""
    for crew_id in sorted(crews):
        try:
            crew = registry.build(crew_id, crews[crew_id])
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        else:
            error = (
                "" if hasattr(crew, "kickoff") else f"the factory gave a {type(crew).__name__}, which has no kickoff"
            )
        out.send(Built(crew_id=crew_id, error=error[:MAX_CHECK_ERROR_CHARS]))


async def execute(state: WorkerState, start: Start, crews: dict[str, Any], out: tether.FrameWriter) -> None:
    """Run one job and send exactly one terminal frame. Messages stay generic: no traceback text.

    ``error_type`` is what the reference sidecar reports (the exception's class name); ``reason`` is ours.
    """
    work = prepare(state, start, crews, out)
    if isinstance(work, Failed):
        tracing.started(state.trace, work.error_type)
        out.send(work)
        return
    out.send(Started())
    tracing.started(state.trace)
    # Work that may have had effects leaves its outcome uncertain; a read-only query has none.
    effects = work.operation not in READ_ONLY_OPERATIONS
    try:
        with tracing.span(state.trace, SpanName.KICKOFF):
            output = await HANDLERS[work.operation](work)
        output = bounded(output)
    except OutputTooLarge as exc:
        out.send(failed("RegistryError", Reason.OUTPUT_TOO_LARGE, str(exc), effects))
    except OperationError as exc:  # our own words (or CrewAI's configuration text), refused before any work
        out.send(failed(type(exc).__name__, Reason.OPERATION_REFUSED, str(exc), False))
    except Exception as exc:
        _for_the_operator(exc)
        out.send(failed(type(exc).__name__, Reason.OPERATION_FAILED, "CrewAI operation failed", effects))
    else:
        out.send(Completed(output=output))


def prepare(state: WorkerState, start: Start, crews: dict[str, Any], out: tether.FrameWriter) -> Work | Failed:
    """The job's crew built, its calls, tasks and spans followed, its CPU bounded: the operation's ``Work``; or,
    nothing of it run, why the job fails before it starts. ``start.operation`` becomes an ``Operation`` here, where
    the worker checks it is one it has."""
    operation = Operation(start.operation) if start.operation in HANDLERS else None
    if start.crew_id not in crews or operation is None:
        what, reason = (
            ("crew", Reason.UNKNOWN_CREW) if start.crew_id not in crews else ("operation", Reason.UNKNOWN_OPERATION)
        )
        return failed(reason, reason, f"this worker has no such {what}", False)
    entry = crews[start.crew_id]
    secrets = secrets_of(start)  # before the crew's code runs, which may change its environment
    out.send(Building())  # the crew's code runs from here on: what only a worker finds before it is said by now
    try:
        crew = registry.build(start.crew_id, entry)
    except registry.NotAFactory as exc:  # our own words, with the fix the doctor gives too
        return failed(type(exc).__name__, Reason.CREW_FACTORY_FAILED, f"{exc}; fix: {exc.fix}", False)
    except Exception as exc:  # a broken factory is the registry's fault, reported by class
        _for_the_operator(exc)
        message = f"the crew factory raised {type(exc).__name__}"
        return failed(type(exc).__name__, Reason.CREW_FACTORY_FAILED, message, False)
    fingerprint = resume.fingerprint(crew) if operation is Operation.RUN else ""
    if (refused := resumed(start, operation, crew, fingerprint)) is not None:
        return refused
    state.ledger = opened = ledger.open_ledger(out.send, secrets, state.trace)
    state.spending = spending.report(out.send, start.max_tokens, start.max_llm_calls, opened)
    tracing.follow(state.trace, crew)
    if operation is Operation.RUN:
        ledger.follow_tasks(opened, crew, fingerprint, start.resumed or [], state.settings.max_event_bytes)
    # As the job starts, not before the factory: a process CPU limit makes the kernel count the process's CPU clock
    # by ticks (its timer running), and a factory timing itself with process_time() read 0 ms of 2 (the bench's).
    tether.bound_cpu(state.settings)
    fresh = functools.partial(_fresh, opened, state.trace, start.crew_id, entry)
    restored = len(start.resumed or ())
    return Work(crew, operation, start.input, out.send, fresh, start.job_id, state.settings, secrets, restored)


def resumed(start: Start, operation: Operation, crew: Any, fingerprint: str) -> Failed | None:
    """A resume's crew given its completed tasks' outputs back, or why it cannot continue the resumed job: nothing
    runs then, so nothing is uncertain."""
    if start.resumed is None:
        return None
    if operation is not Operation.RUN:
        return failed("OperationError", Reason.OPERATION_REFUSED, f"only a run resumes, not {start.operation}", False)
    refusal = resume.refusal(start.crew_id, crew, start.resumed, start.fingerprint, fingerprint)
    if refusal is not None:
        return failed("CrewChanged", Reason.CREW_CHANGED, refusal, False)
    try:
        resume.restore(crew, start.resumed)
    except ValueError:  # pydantic's ValidationError: outputs no TaskOutput takes
        return failed(
            "CrewChanged", Reason.CREW_CHANGED, f"crew {start.crew_id}: the resumed outputs are no tasks'", False
        )
    return None


def _fresh(opened: ledger.Ledger, trace: tracing.Trace | None, crew_id: str, entry: Any) -> Any:
    """Another crew for the job (``batch_run``'s), its classes in the ``opened`` ledger, its tasks traced."""
    crew = registry.build(crew_id, entry)
    ledger.wrap_classes(opened)
    tracing.follow(trace, crew)
    return crew


def secrets_of(start: Start) -> tuple[str, ...]:
    """The values the supervisor masks in all the job writes: of the variables ``Start.secret_names`` names, as its
    environment has them (this worker's own if it carries none)."""
    env = os.environ if start.env is None else start.env
    return tuple(env[name] for name in start.secret_names if env.get(name))


def domain_ahead(state: WorkerState) -> landlock.Ruleset | None:
    """The domain of the job to come, made ahead up to its places; None when jobs run unsandboxed."""
    hiding = state.confinement.hiding
    return hiding.ruleset() if hiding is not None else None


def _for_the_operator(exc: BaseException) -> None:
    """A crew's exception, whole, on the worker's stderr: the contract's event keeps the reference's generic words,
    and the operator reads this in the job's output (``crew-supervisor show``, ``/jobs/{id}/output``, the
    console), with the secrets the supervisor knows redacted, as every tail is. Written before the terminal frame,
    so it is in the tail when the job ends."""
    traceback.print_exception(exc, file=sys.stderr)
    sys.stderr.flush()


def enter(state: WorkerState, start: Start, launched: dict[str, str], domain: landlock.Ruleset | None = None) -> None:
    """Take the job's working directory and environment (telemetry stays off unless the operator's env
    says otherwise): a pre-forked worker had its fork server's until now. A worker launched with the
    job's environment keeps its own, with what its imports added (TOKENIZERS_PARALLELISM, say). Then,
    unless the supervisor runs jobs unsandboxed, enter the job's own domain (``landlock.Hiding``, ``domain`` if made
    ahead): from here on it reaches only what is its own.

    Dumpable again, last (a forked worker inherits the fork server's 0; a spawned one is already): the operator
    can attach a debugger or get a core dump, and a non-root supervisor can read its /proc files to measure it.
    Other jobs' workers cannot (each is in a Landlock domain of its own, where the kernel has one); the
    supervisor and the fork server stay closed to it. An idle pre-forked worker stays closed until here, so no
    running crew can tamper with the process another job will get."""
    tether.name_worker(start)
    if start.cwd is not None:
        os.chdir(start.cwd)
    if start.env is not None and start.env != launched:
        state.settings = tether.adopt_environment(start.env, state.settings)
        tether.prepare_environment()
    if start.writable is not None:
        _confine(state, start.writable, domain)
    places.follow_job()
    tether.set_dumpable(True)


def _confine(state: WorkerState, writable: list[str], domain: landlock.Ruleset | None) -> None:
    """Enter the job's domain, or raise OSError: never run a crew outside the sandbox the supervisor asked for."""
    hiding = state.confinement.hiding
    if hiding is None:
        raise OSError(errno.EINVAL, "this worker was launched without what its sandbox hides")
    if writable == state.confinement.confined_to:  # spawned for this job: in its domain from its start, its threads too
        return
    # Landlock confines the thread that restricts itself (and those it starts after): no other may run now.
    if len(os.listdir("/proc/self/task")) > 1:
        others = ", ".join(thread.name for thread in threading.enumerate() if thread is not threading.current_thread())
        raise OSError(errno.EBUSY, f"threads run beside this one ({others or 'not Python'}): they would stay outside")
    hiding.enter(writable, domain)


def failed(error_type: str, reason: Reason, message: str, uncertain: bool) -> Failed:
    return Failed(error_type=error_type, reason=reason, message=message, uncertain_outcome=uncertain)
