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
    Operation,
    Reason,
    Registry,
    SpanName,
    Start,
    Started,
)
from worker import landlock, ledger, places, registry, resume, spending, tether, tracing, warmup
from worker.operations import HANDLERS, OperationError, OutputTooLarge, Work, bounded

MAX_CHECK_ERROR_CHARS = 1000  # one line of the doctor's report, not a traceback


def run(
    event_fd: int,
    control_fd: int,
    crews: dict[str, Any] | None = None,
    mode: str = "job",
    domain: landlock.Ruleset | None = None,
    only: str | None = None,
) -> NoReturn:
    """Serve one job, or (``mode``) describe the registry or also check that each crew builds (``only``: that crew
    alone, launched with its env file, the warm-up not rehearsed again); ``crews`` comes preloaded from a fork
    server, and ``domain`` (its job's sandbox) made ready ahead (``domain_ahead``)."""
    launched = dict(os.environ)  # what it was started (or forked) with, before imports add to it
    out = tether.FrameWriter(event_fd)
    control = tether.Control(control_fd, out, ledger.recorded)
    out.send(Hello(pid=os.getpid()))
    try:
        tether.prepare_environment()
        if crews is None:  # cold: watched while it imports, until its Start; a forked worker reads it itself
            control.watch()
            crews = load(out)
        if crews is not None and mode != "job":
            rehearsed = mode == "check" and only is None
            warmed = rehearse_warmup([control.thread] if control.thread else []) if rehearsed else None
            out.send(describe_registry(crews, warmed))
            if mode == "check":
                check({only: crews[only]} if only in crews else crews, out)
        elif crews is not None:
            # Not asyncio.run: its teardown would wait on threads CrewAI may leave blocked.
            start = control.start()
            if start.trace:  # not traced: nothing opened, nothing paid
                tracing.open_trace(out.send, secrets_of(start))
            try:
                enter(start, launched, domain)
            except OSError as exc:  # never run a crew outside the sandbox it was given
                tracing.started(type(exc).__name__)
                out.send(failed(type(exc).__name__, Reason.SANDBOX_FAILED, f"the job's sandbox: {exc}", False))
                return
            control.watch()  # in the job's domain
            asyncio.new_event_loop().run_until_complete(execute(start, crews, out))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        out.close()
        # Interpreter teardown after CrewAI costs 1-1.5 s; the terminal frame is already written.
        os._exit(0)


def load(out: tether.FrameWriter) -> dict[str, Any] | None:
    """The registry, or None after telling the supervisor why it cannot be loaded."""
    spec = tether.settings.registry
    try:
        return registry.load(spec)
    except Exception as exc:
        # Registry errors are configuration, so their text is safe and needed to fix startup.
        message = f"{spec}: {type(exc).__name__}: {exc}"
        out.send(failed(Reason.REGISTRY_ERROR, Reason.REGISTRY_ERROR, message, False))
        return None


def describe_registry(crews: dict[str, Any], warmed: dict[str, Any] | None = None) -> Registry:
    eval_llms = sorted(registry.eval_llms(tether.settings.registry))
    budgets = spending.budgets(crews)
    return Registry(sorted(crews), eval_llms, warmed or {}, budgets, contained=tether.contained, sandbox=tether.offered)


def rehearse_warmup(ours: list[threading.Thread]) -> dict[str, Any]:
    """What a fork server's warm-up would warm here (``warmup.Warmth``), or ``refused``: why it would refuse.
    ``ours`` are this worker's own threads (its control pipe's), which a fork server does not have."""
    try:
        return dataclasses.asdict(warmup.warm(ours=ours))
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


async def execute(start: Start, crews: dict[str, Any], out: tether.FrameWriter) -> None:
    """Run one job and send exactly one terminal frame. Messages stay generic: no traceback text.

    ``error_type`` is what the reference sidecar reports (the exception's class name); ``reason`` is ours.
    """
    work = prepare(start, crews, out)
    if isinstance(work, Failed):
        tracing.started(work.error_type)
        out.send(work)
        return
    out.send(Started())
    tracing.started()
    # Work that may have had effects leaves its outcome uncertain; a read-only query has none.
    effects = start.operation not in READ_ONLY_OPERATIONS
    try:
        with tracing.span(SpanName.KICKOFF):
            output = await HANDLERS[start.operation](work)
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


def prepare(start: Start, crews: dict[str, Any], out: tether.FrameWriter) -> Work | Failed:
    """The job's crew built, its calls, tasks and spans followed, its CPU bounded: the operation's ``Work``; or,
    nothing of it run, why the job fails before it starts."""
    if start.crew_id not in crews or start.operation not in HANDLERS:
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
    fingerprint = resume.fingerprint(crew) if start.operation == Operation.RUN else ""
    if (refused := resumed(start, crew, fingerprint)) is not None:
        return refused
    spending.report(out.send, start.max_tokens, start.max_llm_calls)
    ledger.open_ledger(out.send, secrets)
    tracing.follow(crew)
    if start.operation == Operation.RUN:
        ledger.follow_tasks(crew, fingerprint, start.resumed or [], tether.settings.max_event_bytes)
    # As the job starts, not before the factory: a process CPU limit makes the kernel count the process's CPU clock
    # by ticks (its timer running), and a factory timing itself with process_time() read 0 ms of 2 (the bench's).
    tether.bound_cpu()
    fresh = functools.partial(_fresh, start.crew_id, entry)
    return Work(crew, start.input, out.send, fresh, start.job_id, secrets, len(start.resumed or ()))


def resumed(start: Start, crew: Any, fingerprint: str) -> Failed | None:
    """A resume's crew given its completed tasks' outputs back, or why it cannot continue the resumed job: nothing
    runs then, so nothing is uncertain."""
    if start.resumed is None:
        return None
    if start.operation != Operation.RUN:
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


def _fresh(crew_id: str, entry: Any) -> Any:
    """Another crew for the job (``batch_run``'s), its classes in the ledger, its tasks traced."""
    crew = registry.build(crew_id, entry)
    ledger.wrap_classes()
    tracing.follow(crew)
    return crew


def secrets_of(start: Start) -> tuple[str, ...]:
    """The values the supervisor masks in all the job writes: of the variables ``Start.secret_names`` names, as its
    environment has them (this worker's own if it carries none)."""
    env = os.environ if start.env is None else start.env
    return tuple(env[name] for name in start.secret_names if env.get(name))


def domain_ahead() -> landlock.Ruleset | None:
    """The domain of the job to come, made ahead up to its places; None when jobs run unsandboxed."""
    return tether.hiding.ruleset() if tether.hiding is not None else None


def _for_the_operator(exc: BaseException) -> None:
    """A crew's exception, whole, on the worker's stderr: the contract's event keeps the reference's generic words,
    and the operator reads this in the job's output (``crew-supervisor show``, ``/jobs/{id}/output``, the
    console), with the secrets the supervisor knows redacted, as every tail is. Written before the terminal frame,
    so it is in the tail when the job ends."""
    traceback.print_exception(exc, file=sys.stderr)
    sys.stderr.flush()


def enter(start: Start, launched: dict[str, str], domain: landlock.Ruleset | None = None) -> None:
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
        tether.adopt_environment(start.env)
        tether.prepare_environment()
    if start.writable is not None:
        _confine(start.writable, domain)
    places.follow_job()
    tether.set_dumpable(True)


def _confine(writable: list[str], domain: landlock.Ruleset | None) -> None:
    """Enter the job's domain, or raise OSError: never run a crew outside the sandbox the supervisor asked for."""
    if tether.hiding is None:
        raise OSError(errno.EINVAL, "this worker was launched without what its sandbox hides")
    if writable == tether.confined_to:  # spawned for this job: in its domain from its start, its threads too
        return
    # Landlock confines the thread that restricts itself (and those it starts after): no other may run now.
    if len(os.listdir("/proc/self/task")) > 1:
        others = ", ".join(thread.name for thread in threading.enumerate() if thread is not threading.current_thread())
        raise OSError(errno.EBUSY, f"threads run beside this one ({others or 'not Python'}): they would stay outside")
    tether.hiding.enter(writable, domain)


def failed(error_type: str, reason: str, message: str, uncertain: bool) -> Failed:
    return Failed(error_type=error_type, reason=reason, message=message, uncertain_outcome=uncertain)
