"""How a worker stays tied to its supervisor: death signal, control pipe, frame output."""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import queue
import resource
import signal
import tempfile
import threading
import time
from collections.abc import Callable

import setproctitle

from protocol import (
    HOME,
    QUIET_CREWAI,
    STORAGE_DIR,
    DumpStacks,
    ExitCode,
    FrameError,
    Layer,
    Message,
    MessageReader,
    Recorded,
    Stacks,
    Start,
    Stop,
    WorkerSettings,
    pack,
)
from worker import landlock, seccomp, stacks

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
PR_SET_DUMPABLE = 4
PR_CAPBSET_READ = 23
PR_CAPBSET_DROP = 24
CAP_SETPCAP = 8
LINUX_CAPABILITY_VERSION_3 = 0x20080522


TITLE_CHARS = 200  # of a worker's command line (an action id may be 256 characters)


def name_worker(job: Start | None = None) -> None:
    """What ``ps`` says of a worker: its name ``crew-worker`` (``ps -o comm``, ``top``), and as its command line
    (``ps aux``, ``ps -ef``, ``top -c``) the crew and action id of its job, or that it has none yet, instead
    of the fork server's command line it was forked with."""
    title = "crew-worker (no job yet)" if job is None else f"crew-worker {_word(job.crew_id)} {_word(job.job_id)}"
    setproctitle.setproctitle(title[:TITLE_CHARS])
    ctypes.CDLL(None).prctl(PR_SET_NAME, b"crew-worker", 0, 0, 0)  # setproctitle names it by the title's start


def _word(chosen: str) -> str:
    """A client's id as one word of a command line: a space or an unprintable character would let it pass for
    more (``x python -m worker forkserver``) in ``ps`` or ``pkill -f``."""
    return "".join(c if c.isprintable() and not c.isspace() else "?" for c in chosen)


def lower_priority(settings: WorkerSettings) -> None:
    """The workers' niceness (``WORKER_NICE``), before any thread exists so all inherit it.

    It counts against the supervisor's because a worker stays in its session: where the kernel groups
    scheduling by session (autogroup, on in most distributions' kernels), a session of its own would
    weigh as much as the supervisor's whatever its nice value."""
    os.nice(settings.nice)


def take_settings(settings: WorkerSettings | None = None) -> WorkerSettings:
    """Move the supervisor's settings (``AIP_CREWAI_*``: the registry, niceness, warm-up, training directory, the
    workers' uid) out of ``os.environ``, ``settings``' kept where it has none: the worker reads them in its state,
    and no job's code finds them in its environment, nor passes them on to what it runs."""
    return WorkerSettings.take(os.environ, settings)


def adopt_environment(env: dict[str, str], settings: WorkerSettings) -> WorkerSettings:
    """``env`` becomes this process's whole environment, without the settings it carries (``take_settings``): those
    returned replace ``settings``, kept where ``env`` has none (a Fork's carry its worker's, a Start's none).
    ``tempfile`` forgets the temporary directory it found (a forked worker's was its fork server's)."""
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None
    return take_settings(settings)


def bind_to_parent(parent_pid: int) -> None:
    """Die with the supervisor: arm PDEATHSIG, then catch a parent that died before it was armed."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:
        os._exit(ExitCode.ORPHANED)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


@dataclasses.dataclass(frozen=True)
class Confinement:
    """What ``confine`` left a process in, for good (``WorkerState.confinement``)."""

    hiding: landlock.Hiding | None = None  # what its domain hides, listed once: its jobs' hide the same
    confined_to: list[str] = dataclasses.field(default_factory=list)  # what its domain lets it change
    contained: bool = False  # it can leave no cgroup
    offered: list[Layer] = dataclasses.field(default_factory=list)  # the layers of a job's sandbox here


def confine(settings: WorkerSettings) -> Confinement:
    """What every worker process (and the fork server) gives up first, before any crew code runs.

    - Its rlimits (``settings.rlimits``: open files, address space, file size), lowered only. Set here by the
      process itself, since the kernel lets no other set them without its uid or CAP_SYS_RESOURCE (a root
      supervisor with WORKER_USER may lack it); hard ones, which nothing it runs can raise again (it keeps no
      capability). A worker the fork server forks inherits them.
    - umask 077: CrewAI's storage, HOME and scratch files are 0600/0700 whatever the supervisor's umask;
      the fork server's workers inherit it.
    - Every capability, when it has any (a root supervisor's children have them all): CAP_SYS_PTRACE,
      CAP_SYS_ADMIN and CAP_PERFMON each override the supervisor's PR_SET_DUMPABLE 0, so a root worker
      could otherwise still read its environ or attach to it. The bounding set is emptied too, so nothing
      the crew executes (a setuid-root binary included) gets one back.
    - With ``settings.ids`` (the supervisor's WORKER_USER as (uid, gid)), root's uid and groups: no supplementary
      groups, then that gid, then that uid (real, effective and saved, so none can be taken back). The
      bounding set is emptied first, while CAP_SETPCAP is still ours (the uid change takes it); the uid
      change clears the other capabilities. It also clears PR_SET_PDEATHSIG: the caller arms it after.
      Without ``ids`` the uid stays: the same uid's reach remains where the sandbox does not close it, see
      docs/security.md.
    - Last, no_new_privs and the seccomp deny-list (``seccomp.refuse_unneeded_calls``: ptrace, namespaces,
      mounts, BPF and the other calls a crew never needs; clone3, so no child starts in another cgroup), then the
      workers' Landlock domain (``landlock.Hiding``: nothing hidden readable, nothing but the workers' places
      writable, no process outside traced or signalled), or with jobs unsandboxed only no cgroup file writable
      (``landlock.deny_cgroup_writes``): either way a job cannot leave its cgroups, however it got the rights to a
      root cgroup's files. ``contained`` says whether that holds.
    """
    os.umask(0o077)
    for name, value in settings.rlimits:
        _lower(getattr(resource, name), value)
    hiding = None
    if hidden := list(settings.hidden):  # listed before any uid change: a workers' user may not list a 0711 one
        hiding = landlock.Hiding(hidden)
    libc = ctypes.CDLL(None, use_errno=True)
    header = _CapHeader(LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget failed")
    capable = any(word.effective | word.permitted | word.inheritable for word in data)
    if capable and data[0].effective & (1 << CAP_SETPCAP):  # needed to shrink the bounding set
        cap = 0
        while libc.prctl(PR_CAPBSET_READ, cap, 0, 0, 0) >= 0:  # EINVAL past the kernel's last capability
            if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")
            cap += 1
    if settings.ids is not None:  # without CAP_SETUID/CAP_SETGID (a non-root supervisor's worker) this raises
        uid, gid = settings.ids
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    if capable and libc.capset(ctypes.byref(header), (_CapData * 2)()) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")
    unjudged = hiding is not None and hiding.version == 2  # Landlock judges truncate(2) from ABI 3 on
    refused = seccomp.refuse_unneeded_calls(seccomp.TRUNCATE_BY_PATH if unjudged else None)  # with Landlock or not
    confined_to = list(settings.writable)
    held = bool(hiding.enter(confined_to)) if hiding is not None else landlock.deny_cgroup_writes()
    offered = [Layer.SECCOMP] * (refused >= frozenset(seccomp.REFUSED)) + landlock.layers(landlock.abi())
    return Confinement(hiding, confined_to, held and "clone3" in refused, offered)


def bound_cpu(settings: WorkerSettings) -> None:
    """As its job starts: the kernel stops this process ``settings.cpu_backstop`` CPU seconds from now, SIGXCPU
    first, SIGKILL a second later (none without one). A backstop behind the supervisor's sampler, which counts
    the job's whole tree; this counts the process, which its imports (a cold start's) counted for already."""
    if settings.cpu_backstop:
        soft = int(time.process_time()) + settings.cpu_backstop
        _lower(resource.RLIMIT_CPU, soft, soft + 1)


def _lower(kind: int, soft: int, hard: int | None = None) -> None:
    """Lower only: a hard limit already tighter (the operator's own ulimit) is kept."""
    hard = soft if hard is None else hard
    _, current = resource.getrlimit(kind)
    hard = hard if current == resource.RLIM_INFINITY else min(hard, current)
    resource.setrlimit(kind, (min(soft, hard), hard))


def set_dumpable(dumpable: bool) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, int(dumpable), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")


class _TokenCountGuess(logging.Filter):
    """CrewAI 1.15 warns on every call of a model it cannot count tokens for natively (every provider
    through the OpenAI-compatible path): two lines a job would fill its stderr and the last output an operator
    sees (``top``, ``/workers``), hiding what the crew itself wrote. It says nothing of the job: dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Using an approximate input token count")


def quiet_crewai_logs() -> None:
    """Before CrewAI is imported, so that every worker of this process's line has it."""
    logging.getLogger("crewai.llms.base_llm").addFilter(_TokenCountGuess())


def prepare_environment() -> None:
    """Telemetry off unless the operator chose otherwise; storage must be absolute; HOME (one per crew,
    made by the supervisor's ``worker_env``) exists."""
    for name, value in QUIET_CREWAI.items():
        os.environ.setdefault(name, value)
    home = os.environ.get(HOME)
    if home:
        os.makedirs(home, mode=0o700, exist_ok=True)
    storage = os.environ.get(STORAGE_DIR)
    if storage:
        if not os.path.isabs(storage):
            raise ValueError(f"{STORAGE_DIR} must be an absolute path")
        os.makedirs(storage, mode=0o700, exist_ok=True)
        # Without this marker the first replay per storage dir prints a tracing prompt.
        marker = os.path.join(storage, ".crewai_user.json")
        if not os.path.exists(marker):
            with open(marker, "w") as fh:
                fh.write('{"first_execution_done": true}')


class Control:
    """The control pipe: one Start, then only EOF or Stop, either of which ends the process at once, DumpStacks,
    which it answers with the job's stacks, or Recorded, which lets the thread waiting on that ledger entry go on
    (``worker.ledger``; one nobody waits for is a protocol fault, as any other message is).

    A thread watches it, so nothing the job does can delay that. A cold worker's watches while it imports, until
    its Start, and ends there; a worker forked ahead of demand reads its Start itself (no wake-up of another thread
    on the start's path, ~2 ms here). Either way the thread that watches the job is started once the job's sandbox
    is entered (``watch`` again): Landlock confines the thread that restricts itself and those it starts after,
    so a thread started before would keep a wider domain, which crew code could borrow.
    """

    def __init__(self, fd: int, out: FrameWriter, recorded: Callable[[int], bool]) -> None:
        self._fd = fd
        self._out = out  # where the job's stacks go (``DumpStacks``)
        self._recorded = recorded  # ``WorkerState.recorded``: False when nobody waits for that entry
        self._reader = MessageReader()
        self._read_ahead: list[Message] = []  # messages that came in the same read as an earlier one
        self._starts: queue.Queue[Start] = queue.Queue(maxsize=1)
        self._started = False
        self.thread: threading.Thread | None = None

    def watch(self) -> None:
        """A thread reads from now on: until the Start (a cold worker, before it imports), or for good (the job's)."""
        self.thread = threading.Thread(target=self._watch, args=(not self._started,), name="control", daemon=True)
        self.thread.start()

    def start(self) -> Start:
        """The job's Start: read here, or by the thread watching until it came (which has ended once it is here)."""
        if self.thread is None:
            self._accept(self._next())
        start = self._starts.get()
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        return start

    def _watch(self, until_start: bool) -> None:
        while not (until_start and self._started):
            self._accept(self._next())

    def _accept(self, message: Message) -> None:
        if isinstance(message, Start) and not self._started:
            self._started = True
            self._starts.put(message)
            return
        if isinstance(message, DumpStacks) and self._started:
            try:
                answer = stacks.take()
                pack(answer)  # a name or path no frame can hold (a lone surrogate) must not end this thread
            except (TypeError, ValueError):
                answer = Stacks(threads=[])
            self._out.send(answer)
            return
        if isinstance(message, Recorded) and self._started and self._recorded(message.id):
            return
        os._exit(ExitCode.STOPPED if isinstance(message, Stop) else ExitCode.PROTOCOL)

    def _next(self) -> Message:
        while not self._read_ahead:
            data = os.read(self._fd, 65536)
            if not data:
                os._exit(ExitCode.CONTROL_CLOSED)
            try:
                self._read_ahead = self._reader.feed(data)
            except FrameError:
                os._exit(ExitCode.PROTOCOL)
        return self._read_ahead.pop(0)


class FrameWriter:
    """Writes whole frames to the event pipe; a lock keeps frames from interleaving."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = threading.Lock()

    def send(self, message: Message) -> None:
        view = memoryview(pack(message))
        with self._lock:
            while view:
                view = view[os.write(self._fd, view) :]

    def close(self) -> None:
        """Before the process exits: let a frame another thread is writing (the control thread's ``Stacks``) end
        whole, and no other begin. Cut off by ``os._exit``, it would reach the supervisor as a broken frame."""
        self._lock.acquire()
