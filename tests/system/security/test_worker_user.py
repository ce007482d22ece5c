"""A root supervisor runs its workers and fork server as another user (``AIP_CREWAI_WORKER_USER``).

A crew probes from inside its worker (``tests/crews/prober.py``): it runs as that uid and gid with no
supplementary group and no capability (the bounding set included); the supervisor's environ, ptrace,
pidfd_getfd and signals are refused; the journal, its lock and the state directory's listing are not
readable; its scratch directory, HOME and CrewAI storage are writable. A cancel still kills the worker
and proves it, a memory hog is still measured (PSS needs root's access to another uid's /proc) and
killed, and a worker whose uid changed still dies with its parent (the change clears PDEATHSIG, so it
is armed after). Setting it without root, or to root, is refused in one line, and so is a user that cannot
run the interpreter (or import the registry's module): serve names the place it cannot pass and its fix, and
the doctor says the same.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import struct
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import psutil
import pytest

from protocol import WORKER_IDS
from supervisor.config import ConfigError, load
from supervisor.journal.errors import JournalError
from supervisor.journal.statefiles import prepare_directory, prepare_places
from supervisor.layout import WORKER_PLACES
from supervisor.testing import free_port
from tests.conftest import (
    ROOT,
    TEST_REGISTRY,
    gone,
    memory_stop_checked,
    reaped_orphan,
    sse_events,
    start_server,
    wait_until,
    worker_env,
)

USER = "nobody"
DENIED = {"EACCES", "EPERM"}
MEMORY_MB = 300
CONFIG = {"AIP_CREWAI_REGISTRY": "worker.demo:registry", "AIP_CREWAI_BEARER_TOKEN": "t", "AIP_CREWAI_STATE_FILE": "/x"}

EXIT_SECONDS = 60.0  # the refusal comes before any worker: seconds even at load 10; more is a hang
DOCTOR_SECONDS = 300  # the good case builds the crews in a worker (CrewAI's import) on a loaded machine
LIGHT_REGISTRY = (
    "class Plain:\n    def kickoff(self, inputs=None):\n        return None\n\n\nregistry = {'plain': Plain}\n"
)

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="only a root supervisor can run workers as another user")


@pytest.fixture(scope="module")
def ids() -> tuple[int, int]:
    try:
        entry = pwd.getpwnam(USER)
    except KeyError:
        pytest.skip(f"no user {USER!r} on this machine")
    return entry.pw_uid, entry.pw_gid


@pytest.fixture(scope="module")
def runtime(ids: tuple[int, int]) -> tuple[str, list[str]]:
    """An interpreter the worker user can run, and the package directories to put on its path.

    The workers run the supervisor's own interpreter, so it and its packages must be readable by that
    user (docs/security.md). The venv's interpreter here links into /root (0700), so where it is out of reach the
    system's interpreter of the same minor version runs the supervisor, on the venv's packages.
    """
    packages = list(dict.fromkeys(sysconfig.get_paths()[kind] for kind in ("purelib", "platlib")))
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), *packages]), "HOME": "/"}
    minor = f"{sys.version_info.major}.{sys.version_info.minor}"
    for python in dict.fromkeys([sys.executable, f"/usr/bin/python{minor}"]):
        command = [python, "-c", "import orjson, psutil, pydantic_core, supervisor, worker"]
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            probe = subprocess.run(
                command, user=ids[0], group=ids[1], extra_groups=[], env=env, cwd="/", capture_output=True, timeout=60
            )
            if probe.returncode == 0:
                return python, packages
    pytest.skip(f"user {USER!r} can run no Python {minor} that reaches this tree and its packages")


@pytest.fixture
def closed_python(base: Path, runtime: tuple[str, list[str]]) -> tuple[str, Path]:
    """The runtime's interpreter and standard library copied under a directory only root may enter (0700), as
    a Python built under ``/root`` (pyenv's) or a private ``/opt`` holds them: started as root, a worker finds
    its standard library there, and loses it when it takes the workers' uid. The directory, and the copy."""
    python, _ = runtime
    where = (
        "import json, os, sys, sysconfig;"
        " print(json.dumps([os.path.realpath(sys.executable), sysconfig.get_path('stdlib')]))"
    )
    executable, stdlib = json.loads(subprocess.run([python, "-c", where], capture_output=True, check=True).stdout)
    closed = base / "closed"
    closed.mkdir(mode=0o700)
    minor = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (closed / "bin").mkdir()
    shutil.copy2(executable, closed / "bin" / minor)
    skipped = shutil.ignore_patterns("site-packages", "dist-packages", "__pycache__", "test", "idlelib", "tkinter")
    shutil.copytree(stdlib, closed / "lib" / minor, copy_function=_link, ignore=skipped)
    copy = str(closed / "bin" / minor)
    found = subprocess.run([copy, "-c", "import sys, sqlite3; print(sys.prefix)"], capture_output=True, text=True)
    if found.stdout.strip() != str(closed):
        pytest.skip(f"a copy of {executable} does not take the standard library beside it: {found.stderr.strip()}")
    return copy, closed


def _link(source: str, target: str) -> None:
    """A hard link (no copy of 40 MB), or a copy across filesystems."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


@root_only
@pytest.mark.timeout(120)
@pytest.mark.parametrize("through", ["the interpreter", "a link to it"])
def test_a_worker_user_that_cannot_reach_the_interpreter_is_refused_at_start(
    base: Path, runtime: tuple[str, list[str]], closed_python: tuple[str, Path], through: str
) -> None:
    """Without the check its workers failed at their first import as that user ("No module named ..."). A
    venv's ``bin/python`` is a link into the Python it was made from: the same refusal, through the link."""
    _, packages = runtime
    python, closed = closed_python
    if through == "a link to it":
        (base / "venv").mkdir(mode=0o755)
        (base / "venv" / "python").symlink_to(python)
        python = str(base / "venv" / "python")
    state = base / "state"
    lines = refusal(state, python, packages)
    assert lines[0].startswith(f"crew-supervisor: workers as AIP_CREWAI_WORKER_USER='{USER}' (uid "), lines
    assert f" cannot import sqlite3 (the standard library, {_stdlib(closed)}/sqlite3/__init__.py)" in lines[0], lines
    assert f": it may not traverse {closed} (owner 0:0, mode 0700); fix: chmod o+x {closed}, or " in lines[0], lines
    assert not state.exists()  # refused before the state directory was made, let alone a worker started


def refusal(state: Path, python: str, packages: list[str]) -> list[str]:
    """The one line a supervisor on ``python`` with the workers' user printed as it refused to start."""
    server = start_server(state, env={"AIP_CREWAI_WORKER_USER": USER}, python=python, path=packages, wait=False)
    try:
        returncode = server.process.wait(EXIT_SECONDS)
    except subprocess.TimeoutExpired:
        server.kill()
        raise AssertionError("a supervisor whose workers cannot start did not exit") from None
    lines = server.log_tail().strip().splitlines()
    assert returncode == 1 and len(lines) == 1, lines
    return lines


@root_only
@pytest.mark.timeout(120)
def test_a_place_closed_by_an_acl_alone_is_refused_with_the_interpreters_own_error(
    base: Path, ids: tuple[int, int], runtime: tuple[str, list[str]], closed_python: tuple[str, Path]
) -> None:
    """The modes say the user may pass (0755); an ACL entry for that user says not. Modes are all the refusal
    reads, so it names no place: it quotes what the interpreter said, and still refuses before the state."""
    _, packages = runtime
    python, closed = closed_python
    closed.chmod(0o755)
    undefined = 0xFFFFFFFF  # the id of an entry that names none
    # (tag, permissions, id): the owner rwx; that user nothing; the owning group, the mask and others r-x
    entries = [
        (0x01, 7, undefined),
        (0x02, 0, ids[0]),
        (0x04, 5, undefined),
        (0x10, 5, undefined),
        (0x20, 5, undefined),
    ]
    try:  # system.posix_acl_access's binary form: version 2, then (tag, permissions, id) per entry
        os.setxattr(
            closed, "system.posix_acl_access", struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)
        )
    except OSError as exc:
        pytest.skip(f"no POSIX ACL on {closed}: {exc.strerror}")
    state = base / "state"
    lines = refusal(state, python, packages)
    assert f" cannot run {python} and import what they need: ModuleNotFoundError: No module named " in lines[0], lines
    assert f"; fix: make Python and the packages readable by uid {ids[0]}, or " in lines[0], lines
    assert not state.exists()


def _stdlib(closed: Path) -> Path:
    return closed / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"


@root_only
@pytest.mark.timeout(120)
def test_the_doctor_reports_a_worker_user_that_cannot_reach_the_interpreter(
    base: Path, runtime: tuple[str, list[str]], closed_python: tuple[str, Path]
) -> None:
    """The same line, as a problem with its fix; the crews are not built (their worker could only fail)."""
    _, packages = runtime
    python, closed = closed_python
    answer = _doctor(python, base, packages, "worker.demo:registry")
    assert answer.returncode == 1, answer.stdout + answer.stderr
    found = {f["check"]: f for f in orjson.loads(answer.stdout)}
    assert found["runtime"]["status"] == "problem"
    assert f"cannot import sqlite3 (the standard library, {_stdlib(closed)}/" in found["runtime"]["detail"]
    assert f"it may not traverse {closed} (owner 0:0, mode 0700)" in found["runtime"]["detail"]
    assert found["runtime"]["fix"].startswith(f"chmod o+x {closed}, or ")
    assert "registry" not in found and "crew" not in found


@root_only
@pytest.mark.timeout(DOCTOR_SECONDS)
def test_the_registry_module_must_be_reachable_by_the_worker_user(
    base: Path, ids: tuple[int, int], runtime: tuple[str, list[str]]
) -> None:
    """A registry in a directory the user may not traverse: named with its fix. One it may traverse but not list
    (0711) is fine, as for its workers: a worker lists the directories on its path at start, as root."""
    python, packages = runtime
    crews = base / "crews"
    crews.mkdir(mode=0o700)
    (crews / "light_crews.py").write_text(LIGHT_REGISTRY)
    answer = _doctor(python, base, [str(crews), *packages], "light_crews:registry")
    assert answer.returncode == 1, answer.stdout + answer.stderr
    found = {f["check"]: f for f in orjson.loads(answer.stdout)}
    runtime_found = found["runtime"]
    assert f"cannot import light_crews (the registry's module, {crews / 'light_crews.py'})" in runtime_found["detail"]
    assert f"it may not traverse {crews} (owner 0:0, mode 0700)" in runtime_found["detail"]
    assert runtime_found["fix"].startswith(f"chmod o+x {crews}, or ")

    crews.chmod(0o711)
    answer = _doctor(python, base, [str(crews), *packages], "light_crews:registry")
    found = {f["check"]: f for f in orjson.loads(answer.stdout)}
    assert found["runtime"]["status"] == "ok", found["runtime"]
    assert found["runtime"]["detail"].startswith(f"a worker of {python} as uid {ids[0]} imports ")
    registry = found["registry"]
    assert registry["status"] == "ok" and "1 of 1 crews build" in registry["detail"], registry


def _doctor(python: str, base: Path, path: list[str], registry: str) -> subprocess.CompletedProcess[str]:
    """``doctor --json`` on ``python`` with the workers' user, a state directory it may traverse and a token."""
    token = base / "token"
    token.write_text("a-token-for-the-doctor\n")
    token.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIP_CREWAI_")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(ROOT), *path]),
        AIP_CREWAI_REGISTRY=registry,
        AIP_CREWAI_STATE_FILE=str(base / "state" / "journal.db"),
        AIP_CREWAI_BEARER_TOKEN_FILE=str(token),
        AIP_CREWAI_PORT=str(free_port()),
        AIP_CREWAI_WARMUP="offline",
        AIP_CREWAI_WORKER_USER=USER,
    )
    command = [python, "-m", "supervisor", "doctor", "--json"]
    return subprocess.run(command, env=env, cwd=base, capture_output=True, text=True, timeout=DOCTOR_SECONDS)


@root_only
@pytest.mark.parametrize("launcher", ["forkserver", "spawn"])
def test_workers_run_as_the_worker_user_and_cannot_reach_the_supervisor(
    base: Path, ids: tuple[int, int], runtime: tuple[str, list[str]], launcher: str
) -> None:
    python, packages = runtime
    state = base / "state"
    env = {
        "AIP_CREWAI_REGISTRY": TEST_REGISTRY,
        "AIP_CREWAI_LAUNCHER": launcher,
        "AIP_CREWAI_WORKER_USER": USER,
        "AIP_CREWAI_WORKER_MAX_MEMORY_MB": str(MEMORY_MB),
        "AIP_CREWAI_LIMIT_SAMPLE_MS": "50",
    }
    server = start_server(state, env=env, python=python, path=packages)
    try:
        journal = state / "journal.db"
        # The supervisor's own files stay its own; the state directory can be traversed, not listed.
        assert (os.stat(journal).st_uid, os.stat(journal).st_mode & 0o777) == (0, 0o600)
        assert os.stat(state).st_mode & 0o777 == 0o711
        forkserver = server.forkserver()
        assert (forkserver is not None) == (launcher == "forkserver")
        if forkserver is not None:
            assert forkserver.uids() == (ids[0],) * 3 and forkserver.gids() == (ids[1],) * 3
        targets = {"supervisor": server.pid, **({"forkserver": forkserver.pid} if forkserver else {})}
        reads = [str(journal), f"{journal}.lock", str(state)]
        body = {
            "crew_id": "prober",
            "action_id": "probe",
            "input": {"targets": targets, "signals": {"supervisor": server.pid}, "reads": reads},
        }
        with server.client() as client:
            response = client.post("/jobs", json=body, headers={"Idempotency-Key": "probe"})
            assert response.status_code == 200, response.text
            found = json.loads(response.json()["raw"])

            assert found["uids"] == [ids[0]] * 3 and found["gids"] == [ids[1]] * 3 and found["groups"] == []
            no_capabilities = {"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"}
            assert {name for name, value in found["capabilities"].items() if int(value, 16) == 0} == no_capabilities
            for name, outcome in found["targets"].items():
                assert set(outcome.values()) <= DENIED, (name, outcome)
            assert found["signals"] == {"supervisor": "EPERM"}
            assert found["reads"] == dict.fromkeys(reads, "EACCES")
            assert found["writes"] == {"cwd": "ok", "HOME": "ok", "CREWAI_STORAGE_DIR": "ok"}
            assert Path(found["cwd"]).parent == state / "scratch"
            assert not Path(found["cwd"]).exists()  # removed by the supervisor after the job

            # A real kickoff writes CrewAI's storage (its kickoff outputs, for replay) as that user.
            demo = {"crew_id": "demo", "action_id": "demo", "input": {"topic": "uids"}}
            assert client.post("/jobs", json=demo, headers={"Idempotency-Key": "demo"}).status_code == 200
            written = [path for path in (state / "storage").rglob("*") if path.is_file()]
            assert any(path.suffix == ".db" for path in written), written
            for place in WORKER_PLACES:
                assert {path.lstat().st_uid for path in (state / place).rglob("*")} <= {ids[0]}

            _cancel_kills_the_worker(client, ids[0])
            _memory_hog_is_measured_and_killed(client)
    finally:
        server.stop()


# /proc/<pid>/limits' names of the kernel limits the supervisor sets on a worker
PROC_LIMITS = {"open files": "Max open files", "file size": "Max file size", "address space": "Max address space"}
LIMITED = {
    "AIP_CREWAI_WORKER_MAX_OPEN_FILES": "300",
    "AIP_CREWAI_WORKER_MAX_DISK_MB": "64",
    "AIP_CREWAI_WORKER_MAX_ADDRESS_SPACE_MB": "65536",  # past what a CrewAI worker maps
    "AIP_CREWAI_WORKER_MAX_CPU_SECONDS": "600",
}


@root_only
@pytest.mark.parametrize("launcher", ["forkserver", "spawn"])
def test_every_kernel_limit_holds_on_a_worker_of_the_worker_user(
    base: Path, runtime: tuple[str, list[str]], launcher: str
) -> None:
    """Open files, file size, address space and the CPU backstop, as ``/proc/<pid>/limits`` shows them from
    outside (soft and hard: a job may not raise them back), and not one "could not set worker limit" logged.

    Without CAP_SYS_RESOURCE (this machine's root, Docker's) a root supervisor may not ``prlimit`` a process of
    another uid: every such limit was logged as not set, per worker, and the worker ran without it."""
    python, packages = runtime
    env = {"AIP_CREWAI_LAUNCHER": launcher, "AIP_CREWAI_WORKER_USER": USER, **LIMITED}
    server = start_server(base / "state", env=env, python=python, path=packages)
    body = {"crew_id": "demo-slow", "action_id": "limited", "input": {"seconds": 600}}
    with server.client() as client:
        with client.stream("POST", "/jobs/stream", json=body, headers={"Idempotency-Key": "limited"}) as response:
            first = next(sse_events(response))
        assert first["event"] == "started", first
        limits = _proc_limits(first["data"]["pid"])
        client.post("/jobs/limited/cancel", json={"crew_id": "demo-slow", "action_id": "limited"})
    MiB = 1024 * 1024
    assert limits[PROC_LIMITS["open files"]] == (300, 300)
    assert limits[PROC_LIMITS["file size"]] == (64 * MiB, 64 * MiB)
    assert limits[PROC_LIMITS["address space"]] == (65536 * MiB, 65536 * MiB)
    soft, hard = limits["Max cpu time"]  # what the job used before it started, its 600 s, then 5 s of backstop
    assert soft is not None and 605 <= soft < 605 + 60 and hard == soft + 1, (soft, hard)
    assert "could not set worker limit" not in server.log_tail(), server.log_tail()


def _proc_limits(pid: int) -> dict[str, tuple[int | None, int | None]]:
    """A process's soft and hard limits by name, read as anyone may (``prlimit`` on another uid needs
    CAP_SYS_RESOURCE): None is unlimited."""
    found: dict[str, tuple[int | None, int | None]] = {}
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines()[1:]:
        name, soft, hard = line[:26].strip(), *line[26:].split()[:2]
        found[name] = tuple(None if value == "unlimited" else int(value) for value in (soft, hard))  # type: ignore[assignment]
    return found


def _cancel_kills_the_worker(client: httpx.Client, uid: int) -> None:
    body = {"crew_id": "demo-slow", "action_id": "slow", "input": {"seconds": 600}}
    with client.stream("POST", "/jobs/stream", json=body, headers={"Idempotency-Key": "slow"}) as response:
        first = next(sse_events(response))
    assert first["event"] == "started"
    pid = first["data"]["pid"]
    assert psutil.Process(pid).uids() == (uid,) * 3
    record = client.post("/jobs/slow/cancel", json={"crew_id": "demo-slow", "action_id": "slow"}).json()
    assert record["status"] == "cancelled"
    assert record["terminal"]["stop_confirmed"] is True and record["terminal"]["pid"] == pid
    assert gone(pid)


def _memory_hog_is_measured_and_killed(client: httpx.Client) -> None:
    hog = {"crew_id": "runaway-memory", "action_id": "hog"}
    response = client.post("/jobs", json=hog, headers={"Idempotency-Key": "hog"})
    assert response.status_code == 502, response.text
    terminal = client.get("/jobs/hog").json()["terminal"]
    memory_stop_checked(client, terminal, MEMORY_MB)
    assert terminal["stop_confirmed"] is True and gone(terminal["pid"])


@root_only
@pytest.mark.usefixtures("subreaper")  # the orphaned worker comes to us: its exit status says what ended it
def test_a_worker_that_changed_uid_still_dies_with_its_parent(
    base: Path, ids: tuple[int, int], runtime: tuple[str, list[str]]
) -> None:
    """The uid change clears PR_SET_PDEATHSIG: armed before it, this worker would not die by it."""
    python, packages = runtime
    place = base / "worker"
    place.mkdir()
    env = worker_env(place, "worker.demo:registry")  # makes its HOME, as root
    for directory in (place, place / "home"):
        os.chown(directory, *ids)
    env.update({WORKER_IDS: "{}:{}".format(*ids), "PYTHONPATH": os.pathsep.join([str(ROOT), *packages])})
    parent = subprocess.Popen(
        [python, str(ROOT / "tests/helpers/orphaning_parent.py")], env=env, cwd=place, stdout=subprocess.PIPE
    )
    assert parent.stdout is not None
    worker_pid, keeper_pid = map(int, parent.stdout.readline().split())
    try:
        assert psutil.Process(worker_pid).uids() == (ids[0],) * 3
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        status = reaped_orphan(worker_pid, timeout=10)
        assert status is not None, "the worker outlived its parent"
    finally:
        os.kill(keeper_pid, signal.SIGKILL)
        wait_until(lambda: gone(keeper_pid))
    # Killed by the death signal: not by its control pipe (the keeper holds it open) nor its event pipe.
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def test_a_worker_user_needs_a_root_supervisor() -> None:
    with _unprivileged(), pytest.raises(ConfigError) as caught:
        load({}, {**CONFIG, "AIP_CREWAI_WORKER_USER": USER})
    assert "AIP_CREWAI_WORKER_USER" in str(caught.value) and "root" in str(caught.value)


@root_only
@pytest.mark.parametrize(
    ("raw", "says"),
    [("0", "root"), ("65534:0", "root"), ("root", "root"), ("no-such-user-here", "no such user"), ("1:x", "uid:gid")],
)
def test_a_bad_worker_user_is_refused_in_one_line(raw: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load({}, {**CONFIG, "AIP_CREWAI_WORKER_USER": raw})
    assert says in str(caught.value) and "\n" not in str(caught.value)


@root_only
def test_worker_user_resolves_to_its_ids_and_must_own_the_training_dir(tmp_path: Path, ids: tuple[int, int]) -> None:
    assert load({}, {**CONFIG, "AIP_CREWAI_WORKER_USER": USER}).worker_ids == ids
    assert load({}, {**CONFIG, "AIP_CREWAI_WORKER_USER": "4000:4001"}).worker_ids == (4000, 4001)
    assert load({}, CONFIG).worker_ids is None
    training = tmp_path / "training"
    training.mkdir(mode=0o700)
    env = {**CONFIG, "AIP_CREWAI_WORKER_USER": USER, "AIP_CREWAI_ALLOWED_OPERATIONS": "run,train"}
    env["AIP_CREWAI_TRAINING_DIR"] = str(training)
    with pytest.raises(ConfigError, match="must own it"):
        load({}, env)
    os.chown(training, *ids)
    assert load({}, env).worker_ids == ids


@root_only
def test_the_state_directory_must_be_reachable_and_not_the_workers(base: Path, ids: tuple[int, int]) -> None:
    (base / "closed").mkdir(mode=0o700)
    with pytest.raises(JournalError, match="cannot traverse"):
        prepare_directory(base / "closed" / "state", ids)
    writable = base / "writable"
    writable.mkdir()
    os.chown(writable, *ids)
    with pytest.raises(JournalError, match="can write to"):
        prepare_directory(writable / "state", ids)
    theirs = base / "theirs"
    theirs.mkdir()
    os.chown(theirs, *ids)
    with pytest.raises(JournalError, match="owned by the workers' user"):
        prepare_directory(theirs, ids)
    prepare_directory(base / "state", ids)
    assert os.stat(base / "state").st_mode & 0o777 == 0o711


@root_only
def test_places_are_handed_over_without_following_links(base: Path, ids: tuple[int, int]) -> None:
    state = base / "state"
    secret = base / "secret"
    secret.write_text("ours")
    (state / "storage" / "crew").mkdir(parents=True)
    (state / "storage" / "crew" / "old.db").write_text("left by root's workers")
    (state / "storage" / "crew" / "link").symlink_to(secret)
    os.link(secret, state / "storage" / "crew" / "hardlink")
    prepare_places(state, ("storage",), ids)
    assert (state / "storage" / "crew" / "old.db").stat().st_uid == ids[0]
    assert (state / "storage" / "crew").stat().st_uid == ids[0]
    assert secret.stat().st_uid == 0  # neither the symlink nor the hard link reached it


@contextlib.contextmanager
def _unprivileged() -> Iterator[None]:
    """As a non-root supervisor: root takes another effective uid for the while (its saved uid stays 0)."""
    if os.geteuid() != 0:
        yield
        return
    os.seteuid(pwd.getpwnam(USER).pw_uid)
    try:
        yield
    finally:
        os.seteuid(0)
