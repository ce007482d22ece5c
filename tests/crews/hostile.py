"""Crews that push the supervisor's limits, break the protocol or play an orphan: part of ``tests.crews:registry``."""

from __future__ import annotations

import ctypes
import os
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
from crewai import Agent, Crew, Task
from crewai.crews.crew_output import CrewOutput
from crewai.events.types.llm_events import LLMCallType
from crewai.llms.base_llm import llm_call_context
from crewai.types.usage_metrics import UsageMetrics

from protocol import EVENT_FD, PROTOCOL_VERSION, Completed, Failed, Reason, pack
from tests.crews.base import EVIDENCE_DIR, HOUR, LEAKED_KEY, _single
from tests.helpers import family, squatter
from tests.helpers.waiting import wait_until
from worker.demo import OfflineLLM

MiB = 1024 * 1024
FLOOD_BYTES = 24 * MiB
RELAY_SECONDS = 0.3  # of CPU, each process of runaway-reforker's relay
DAEMON_SEEN = "daemon.seen"  # in EVIDENCE_DIR: the test's word that a sample counted runaway-daemon's daemon
HOLD_SECONDS = 30  # the longest a crew here waits for something it needs before failing its job


class SizedLLM(OfflineLLM):
    """Streams one chunk of ``chunk_bytes`` and answers ``answer_bytes``: to meet the byte limits."""

    chunk_bytes: int = 0
    answer_bytes: int = 0

    def call(self, messages: Any, *args: Any, from_task: Any = None, from_agent: Any = None, **kwargs: Any) -> str:
        if self.chunk_bytes and self._effective_stream():
            with llm_call_context():
                self._emit_stream_chunk_event(
                    chunk="c" * self.chunk_bytes,
                    from_task=from_task,
                    from_agent=from_agent,
                    call_type=LLMCallType.LLM_CALL,
                    response_id="sized",
                )
        return "Thought: done\nFinal Answer: " + "a" * self.answer_bytes


def leave_pid(name: str) -> None:
    """Append this process's pid to a file in the test's evidence directory, for the test to check on."""
    with open(os.path.join(os.environ[EVIDENCE_DIR], name), "a") as pids:
        pids.write(f"{os.getpid()}\n")


def _orphan_that_exits() -> None:
    """A grandchild that is orphaned (adopted by the supervisor, a subreaper), then exits: a zombie until
    its new parent reaps it. Returns once it has exited, so the job ends with nothing of it running."""
    readable, writable = os.pipe()
    middle = os.fork()
    if middle == 0:
        try:
            middle_pid = os.getpid()
            if os.fork() == 0 and wait_until(lambda: os.getppid() != middle_pid, timeout=HOLD_SECONDS):  # adopted
                leave_pid("orphan.pids")
                os.write(writable, b"%d" % os.getpid())
        finally:
            os._exit(0)  # the middle at once; the grandchild once it has said who it is
    os.close(writable)
    os.waitpid(middle, 0)
    # The pipe ends when the grandchild's descriptors close, as it exits; then it is a zombie, or reaped.
    said = b"".join(iter(lambda: os.read(readable, 64), b""))
    os.close(readable)
    if not said:
        raise RuntimeError("the grandchild never said who it is: not adopted, or its pid not left")
    orphan = int(said)
    if not wait_until(lambda: not _alive(orphan), timeout=HOLD_SECONDS):
        raise RuntimeError(f"the orphan {orphan} did not exit")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _daemon_seen_by_a_sample() -> None:
    """A child that leaves the job's group and session and runs on, seen by one of the supervisor's samples
    while it is still this worker's child: once the worker exits, only the samples (or a cgroup) tie it to
    the job. The test says a sample has counted it by creating DAEMON_SEEN, which this then consumes."""
    evidence = Path(os.environ[EVIDENCE_DIR])
    pids, seen = evidence / "daemon.pids", evidence / DAEMON_SEEN
    code = "import os, sys, time; os.setsid(); open(sys.argv[1], 'a').write(f'{os.getpid()}\\n'); time.sleep(9999)"
    daemon = subprocess.Popen([sys.executable, "-c", code, str(pids)])
    if not wait_until(lambda: pids.exists() and str(daemon.pid) in pids.read_text().split(), HOLD_SECONDS):
        raise RuntimeError("the daemon never left the session")
    if not wait_until(seen.exists, timeout=HOLD_SECONDS):
        raise RuntimeError("the test never said a sample counted the daemon")
    seen.unlink()


def _leave_a_squatter() -> None:
    """From inside the running job, try to take the supervisor's port (the test writes it in EVIDENCE_DIR first) as a
    squatter would, and say what the kernel answered; then leave a squatter that takes it once the supervisor is
    gone (``tests/helpers/squatter.py``)."""
    evidence = Path(os.environ[EVIDENCE_DIR])
    port = (evidence / squatter.PORT).read_text()
    taken = squatter.take(int(port))
    if not isinstance(taken, str):
        taken.close()
    (evidence / squatter.TRIED).write_text(taken if isinstance(taken, str) else "bound")
    subprocess.run([sys.executable, "-m", "tests.helpers.squatter", str(evidence), port], check=True)


def _burn_in_relays() -> None:
    """CPU burnt by a relay of short-lived processes, each started through a middle one that exits at once: none
    is this worker's child when it ends (the supervisor, a subreaper, reaps it), so no count of the worker's tree
    includes what it used. Each burns ``RELAY_SECONDS`` and ends; the worker starts the next."""
    for _ in range(10_000):
        middle = os.fork()
        if middle == 0:
            if os.fork() == 0:
                burnt_by = time.process_time() + RELAY_SECONDS
                while time.process_time() < burnt_by:
                    pass
            os._exit(0)
        os.waitpid(middle, 0)
        time.sleep(RELAY_SECONDS)  # one relay at a time: the next starts as this one ends


def _fill_places(place: Path) -> None:
    """Write 1 MiB files into ``place`` (the job's scratch directory, or its crew's HOME) until stopped, 4 GiB at
    most; say where in EVIDENCE_DIR first (``disk.place``)."""
    (Path(os.environ[EVIDENCE_DIR]) / "disk.place").write_text(str(place))
    block = os.urandom(MiB)
    for number in range(4096):
        (place / f"fill-{number}").write_bytes(block)


UNNAMED_HOLD_SECONDS = 10  # how long runaway-disk-unnamed holds its files before it answers (if never stopped)
UNNAMED_FILE_MIB = 3  # each file under the tests' 4 MiB WORKER_MAX_DISK_MB, so RLIMIT_FSIZE lets it be written


def _unnamed_file(place: Path, block: bytes) -> int:
    """A file with no name in ``place``, ``UNNAMED_FILE_MIB`` written to it: its descriptor."""
    fd = os.open(place, os.O_TMPFILE | os.O_WRONLY, 0o600)
    for _ in range(UNNAMED_FILE_MIB):
        os.write(fd, block)
    return fd


def _hold_unnamed(files: int, place: Path) -> list[int]:
    """``files`` files with no name in ``place``, held open; their total in EVIDENCE_DIR (``unnamed.bytes``) once
    written."""
    block = os.urandom(MiB)
    held = [_unnamed_file(place, block) for _ in range(files)]
    (Path(os.environ[EVIDENCE_DIR]) / "unnamed.bytes").write_text(str(files * UNNAMED_FILE_MIB * MiB))
    return held


AT_FDCWD, AT_SYMLINK_FOLLOW = -100, 0x400


def _link_into_home(held: list[int]) -> None:
    """Give each held file (made in HOME: the sandbox refuses a link across its places) a name in the crew's HOME,
    kept after the job, as its last act; say where."""
    home = Path(os.environ["HOME"])
    (Path(os.environ[EVIDENCE_DIR]) / "linked.place").write_text(str(home))
    libc = ctypes.CDLL(None, use_errno=True)
    for number, fd in enumerate(held):  # linkat itself: os.link calls link(2), which takes /proc's link for the file
        source, name = f"/proc/self/fd/{fd}".encode(), bytes(home / f"linked-{number}")
        if libc.linkat(AT_FDCWD, source, AT_FDCWD, name, AT_SYMLINK_FOLLOW):
            raise OSError(ctypes.get_errno(), "linkat refused")
        os.close(fd)


def _grow_crew_home() -> bool:
    """Add a named file of ``UNNAMED_FILE_MIB`` to the crew's HOME; whether it was its first."""
    home = Path(os.environ["HOME"])
    grown = sorted(home.glob("grow-*"))
    (home / f"grow-{len(grown)}").write_bytes(os.urandom(UNNAMED_FILE_MIB * MiB))
    return not grown


class RunawayLLM(OfflineLLM):
    """Work that runs away inside a provider call (where a tool's code would run). Each is bounded on its
    own (4 GiB, 2,000 processes, 1 GiB of output), so a broken limit fails a test, not the machine."""

    mode: str

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        mode = self.mode.removeprefix("escape-")
        if mode != self.mode:  # first try to leave the job's cgroups, and its caps with them
            (Path(os.environ[EVIDENCE_DIR]) / f"{self.mode}.result").write_text(family.escape())
        if mode == "memory":
            hoard = [b"\x01" * (16 * MiB) for _ in range(256) if not time.sleep(0.005)]  # touched, so resident
            del hoard
        elif mode == "cpu":
            while True:
                pass
        elif mode == "reforker":
            _burn_in_relays()
        elif mode in ("disk", "disk-home"):
            _fill_places(Path.cwd() if mode == "disk" else Path(os.environ["HOME"]))
        elif mode == "disk-unnamed":  # more than the cap in files no walk of names finds, held a while
            held = _hold_unnamed(8, Path.cwd())
            time.sleep(UNNAMED_HOLD_SECONDS)
            del held
            return super().call(messages, *args, **kwargs)
        elif mode == "disk-linked":  # under the cap in each file, over it together, named only at the very end
            _link_into_home(_hold_unnamed(2, Path(os.environ["HOME"])))
            return super().call(messages, *args, **kwargs)
        elif mode == "disk-crew":  # the crew's HOME grows by a file each job: the first answers, later ones hold
            if _grow_crew_home():
                return super().call(messages, *args, **kwargs)
        elif mode == "forkbomb":
            for _ in range(2000):
                try:
                    if os.fork() == 0:
                        leave_pid("forkbomb.pids")
                        time.sleep(HOUR)
                        os._exit(0)
                except OSError:
                    break  # refused: the limit holds; wait to be stopped
        elif mode == "files":
            hoard = []
            try:
                for _ in range(100_000):
                    hoard.append(open(os.devnull))  # noqa: SIM115 - kept open on purpose
            finally:
                # Closed before the error leaves: CrewAI may call again while the traceback holds this frame.
                for held in hoard:
                    held.close()
                with open(os.path.join(os.environ[EVIDENCE_DIR], "files.count"), "w") as out:
                    out.write(str(len(hoard)))
        elif mode == "events":  # tool calls: a chunk each that no coalescing joins (text would be, worker/chunks.py)
            call = {"id": "flood", "function": {"name": "flood", "arguments": "{}"}, "index": 0}
            with llm_call_context():
                for _ in range(100_000):
                    self._emit_stream_chunk_event(
                        chunk="", tool_call=call, call_type=LLMCallType.TOOL_CALL, response_id="flood"
                    )
        elif mode in ("stdout", "stdout-endless"):
            line = b"flood " * 10922 + b"\n"  # 64 KiB
            for _ in range(FLOOD_BYTES // len(line) if mode == "stdout" else 16384):
                os.write(1, line)
            os.write(2, b"flood done\n")
            return super().call(messages, *args, **kwargs)
        elif mode == "stdout-grandchild":  # a tool's subprocess that inherited the worker's stdout floods it
            flood = "import os\nwhile True:\n    os.write(1, b'flood ' * 10922)"
            subprocess.Popen(
                [sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {flood!r}])"]
            )
        elif mode == "orphan":
            _orphan_that_exits()
            return super().call(messages, *args, **kwargs)
        elif mode == "daemon":
            _daemon_seen_by_a_sample()
            return super().call(messages, *args, **kwargs)
        elif mode == "squatter":
            _leave_a_squatter()
        time.sleep(HOUR)
        return "Final Answer: unreachable"


def _runaway(mode: str) -> Callable[[], Crew]:
    return lambda: _single(RunawayLLM(model=f"runaway-{mode}", mode=mode))


def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


# What a broken worker writes on its event pipe (fd 4) in the middle of its job.
BROKEN_FRAMES = {
    "garbage": _frame(b"\xffnot json at all"),
    "oversized": struct.pack(">I", 2**31) + b"{}",
    "truncated": struct.pack(">I", 100) + b'{"v": %d' % PROTOCOL_VERSION,
    "unknown-message": _frame(b'{"v":%d,"type":"launch"}' % PROTOCOL_VERSION),
    "old-version": _frame(b'{"v":0,"type":"chunk","channel":"x","data":{}}'),
    # Two at once: the worker's real answer cannot follow the first, since its task's TaskDone waits for a Recorded
    # that no supervisor sends once it has a terminal message.
    "second-terminal": pack(Completed(output={"raw": "forged"})) * 2,
    "forged-reason": pack(Failed("MemoryError", Reason.MEMORY_LIMIT_EXCEEDED, "forged", False)),  # ours to say
    # the worker's to say, but only before the crew's code runs: this is the crew blaming its sandbox
    "forged-sandbox": pack(Failed("PermissionError", Reason.SANDBOX_FAILED, "forged", False)),
}


class BreakerLLM(OfflineLLM):
    """A worker that breaks in one chosen way during its job: crashes, exits, or abuses the frame pipe."""

    mode: str

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        if self.mode == "segfault":
            ctypes.string_at(0)
        elif self.mode == "exit3":
            os._exit(3)
        elif self.mode == "close-pipe":
            os.close(EVENT_FD)
        elif self.mode in BROKEN_FRAMES:
            os.write(EVENT_FD, BROKEN_FRAMES[self.mode])
            if self.mode == "second-terminal":
                return super().call(messages, *args, **kwargs)
        time.sleep(HOUR)
        return "Final Answer: unreachable"


def _breaker(mode: str) -> Callable[[], Crew]:
    return lambda: _single(BreakerLLM(model=f"broken-{mode}", mode=mode))


def big_chunk() -> Crew:
    return _single(SizedLLM(model="sized", chunk_bytes=4096))


class SizedCrew(Crew):
    """A real Crew whose kickoff answers ``bytes`` bytes of raw output and nothing else that grows, so an
    output's encoded size is a constant plus that number: a test can meet a byte bound exactly."""

    def kickoff(self, inputs: dict[str, Any] | None = None, *args: Any, **kwargs: Any) -> Any:
        if self.stream:  # CrewAI's streamed kickoff runs this one again with streaming off
            return super().kickoff(inputs, *args, **kwargs)
        size = int((inputs or {}).get("bytes", 0))
        return CrewOutput(raw="a" * size, tasks_output=[], token_usage=UsageMetrics())


def sized_output() -> Crew:
    agent = Agent(role="Sizer", goal="Answer to size", backstory="Exact.", llm=OfflineLLM(model="sized"))
    return SizedCrew(agents=[agent], tasks=[Task(description="Answer.", expected_output="Bytes.", agent=agent)])


class KeyTailCrew(Crew):
    """Ends its stderr with its key (LEAKED_KEY, from its crew's env file), whole or its first ``chars`` characters
    (input), and completes: a tail whose redaction outgrew its byte count once made every later start refuse the
    journal."""

    def kickoff(self, inputs: dict[str, Any] | None = None, *args: Any, **kwargs: Any) -> Any:
        if self.stream:
            return super().kickoff(inputs, *args, **kwargs)
        key = os.environ[LEAKED_KEY]
        sys.stderr.write(key[: int((inputs or {}).get("chars", len(key)))])
        sys.stderr.flush()
        return CrewOutput(raw="printed", tasks_output=[], token_usage=UsageMetrics())


def key_tail() -> Crew:
    agent = Agent(role="Printer", goal="Print", backstory="Careless.", llm=OfflineLLM(model="key-tail"))
    return KeyTailCrew(agents=[agent], tasks=[Task(description="Print.", expected_output="Nothing.", agent=agent)])


RUNAWAY = (
    *("memory", "cpu", "reforker", "disk", "disk-home", "disk-unnamed", "disk-linked", "disk-crew", "forkbomb"),
    *("files", "escape-memory", "escape-forkbomb"),
    *("events", "stdout", "stdout-endless", "stdout-grandchild", "daemon", "orphan", "squatter"),
)
CREWS = {
    "big-chunk": big_chunk,
    "sized-output": sized_output,
    "key-tail": key_tail,
    **{f"runaway-{mode}": _runaway(mode) for mode in RUNAWAY},
    **{f"broken-{mode}": _breaker(mode) for mode in ("segfault", "exit3", "close-pipe", *BROKEN_FRAMES)},
}
