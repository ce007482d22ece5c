"""A port a stranger holds is one line naming it, before any child starts, and nothing is killed; a signal during
start-up ends it at once, and leaves nothing behind. (A port a dead supervisor's job left holding it:
``test_restart_port.py``.)"""

from __future__ import annotations

import contextlib
import os
import pwd
import shlex
import signal
import socket
import subprocess
import sys
import sysconfig
from pathlib import Path

import psutil
import pytest

from supervisor import listener
from supervisor.journal.store import Journal
from supervisor.testing import free_port
from tests.conftest import ROOT, gone, start_server, wait_until

EXIT_SECONDS = 60.0  # the refusal comes before any child: seconds even at load 10; more is a hang


def listening(pid: int, port: int) -> bool:
    return any(
        connection.laddr.port == port and connection.pid == pid and connection.status == psutil.CONN_LISTEN
        for connection in psutil.net_connections("tcp")
    )


def test_a_port_a_stranger_holds_is_refused_in_one_line_naming_it(tmp_path: Path) -> None:
    port = free_port()
    command = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)]
    stranger = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: listening(stranger.pid, port), timeout=30)
        server = start_server(tmp_path / "state", port=port, wait=False)
        try:
            returncode = server.process.wait(EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            server.kill()
            raise AssertionError("a supervisor on a port in use did not exit") from None
        lines = server.log_tail().strip().splitlines()
        assert returncode == 1
        held = f"held by pid {stranger.pid} ({shlex.join(command)})"
        assert lines == [f"crew-supervisor: cannot listen on 127.0.0.1:{port}: Address already in use: {held}"], lines
        assert stranger.poll() is None and listening(stranger.pid, port)  # a stranger is named, never killed
        Journal(tmp_path / "state" / "journal.db", checkpoint_events=1).close()  # its lock was let go
    finally:
        stranger.kill()
        stranger.wait()


def test_a_host_given_by_name_is_looked_up_to_find_who_holds_it() -> None:
    """``HOST=localhost``: the holder's socket is on the address the name resolves to, not on the name."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(listener.ListenError) as refused:
            listener.bind("localhost", port)
    assert str(refused.value).startswith(
        f"cannot listen on localhost:{port}: Address already in use: held by pid {os.getpid()} ("
    )


@pytest.mark.parametrize("unreadable", ["procfs", "denied"])
def test_a_holder_that_cannot_be_looked_for_leaves_the_refusal_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unreadable: str
) -> None:
    """The search for the holder failing (a /proc without its tables; psutil's AccessDenied, as where the system
    refuses the socket table) is said in the line, never raised past it: ``serve`` prints the line, no traceback."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        if unreadable == "procfs":
            monkeypatch.setattr(psutil, "PROCFS_PATH", str(tmp_path))  # psutil reads its /proc/net/tcp there
        else:

            def denied(kind: str = "inet") -> list[object]:
                raise psutil.AccessDenied(msg="the socket table")

            monkeypatch.setattr(psutil, "net_connections", denied)
        with pytest.raises(listener.ListenError) as refused:
            listener.bind("127.0.0.1", port)
    why = {"procfs": "FileNotFoundError: [Errno 2] No such file or directory", "denied": "AccessDenied"}[unreadable]
    line = str(refused.value)
    assert line.startswith(f"cannot listen on 127.0.0.1:{port}: Address already in use: who holds it cannot be found")
    assert why in line and "\n" not in line


UNSEEN = """
from supervisor import listener
try:
    listener.bind("127.0.0.1", {port}).close()
except listener.ListenError as refused:
    print(refused)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to hold a port as one uid and ask as another")
def test_a_holder_another_uid_cannot_see_is_said_so() -> None:
    """Without privilege, another uid's /proc/<pid>/fd cannot be read: the line says so, and how to find out."""
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody' here")
    packages = dict.fromkeys(sysconfig.get_paths()[kind] for kind in ("purelib", "platlib"))
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), *packages]), "HOME": "/"}
    minor = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"  # the venv's may be in /root
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for python in dict.fromkeys([sys.executable, minor]):
            with contextlib.suppress(OSError):
                asked = subprocess.run(
                    [python, "-c", UNSEEN.format(port=port)],
                    user=nobody.pw_uid,
                    group=nobody.pw_gid,
                    extra_groups=[],
                    env=env,
                    cwd="/",
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                if asked.returncode == 0:
                    break
        else:
            pytest.skip("'nobody' can run no Python that reaches this tree")
    assert asked.stdout.strip() == (
        f"cannot listen on 127.0.0.1:{port}: Address already in use: held by a process this user cannot see"
        " (another user's: `ss -ltnp` as root names it)"
    )


def test_the_port_cannot_be_had_from_its_bind_to_its_listen(tmp_path: Path) -> None:
    """Between the two (the crews' description), another socket with the options that share an address (as a crew's
    import-time code would try) is refused; the listen itself still takes the port over a connection of an earlier
    run in TIME_WAIT."""
    earlier = socket.socket()
    earlier.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    earlier.bind(("127.0.0.1", 0))
    earlier.listen()
    port = earlier.getsockname()[1]
    with socket.create_connection(("127.0.0.1", port)) as client:
        accepted, _ = earlier.accept()
        accepted.close()  # the server's side closes first: its end waits in TIME_WAIT
        assert client.recv(1) == b""
    earlier.close()
    bound = listener.bind("127.0.0.1", port)
    try:
        for options in ((socket.SO_REUSEADDR,), (socket.SO_REUSEADDR, socket.SO_REUSEPORT)):
            with socket.socket() as thief:
                for option in options:
                    thief.setsockopt(socket.SOL_SOCKET, option, 1)
                with pytest.raises(OSError, match="Address already in use"):
                    thief.bind(("127.0.0.1", port))
        bound.listen()
        assert not bound.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT)
    finally:
        bound.close()


SLOW_REGISTRY = """
import time
time.sleep(600)  # a registry whose import takes ten minutes: the start-up is still describing it
from tests.crews import registry
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_start_up_ends_it_at_once_and_leaves_nothing(tmp_path: Path, sig: signal.Signals) -> None:
    (tmp_path / "slow_registry.py").write_text(SLOW_REGISTRY)
    state = tmp_path / "state"
    server = start_server(state, registry="slow_registry:registry", path=[str(tmp_path)], wait=False)

    def describing() -> list[tuple[int, float]]:
        return [(child.pid, child.create_time()) for child in psutil.Process(server.process.pid).children()]

    assert wait_until(lambda: bool(describing()), timeout=EXIT_SECONDS)
    children = describing()
    server.process.send_signal(sig)
    try:
        returncode = server.process.wait(EXIT_SECONDS)  # far below the registry's ten minutes
    except subprocess.TimeoutExpired:
        server.kill()
        raise AssertionError("a signal during start-up did not end it") from None
    assert returncode == -sig  # ended by the signal, as a serving supervisor is (SIGINT: by its KeyboardInterrupt)
    assert children and all(gone(*child) for child in children)  # the describing process too
    Journal(state / "journal.db", checkpoint_events=1).close()  # its lock was let go


def test_a_crashed_supervisor_s_connections_do_not_keep_its_restart_off_its_port(tmp_path: Path) -> None:
    """A kill -9 leaves the server's end of each kept-alive connection to the kernel (FIN-WAIT, then TIME_WAIT once
    the client closes), with the listener's SO_REUSEADDR as it was when accepted: off, once uvloop listened past our
    ``Listener.listen``, so the restart's bind of the port was refused."""
    first = start_server(tmp_path / "state")
    clients = [first.client() for _ in range(3)]
    for client in clients:
        assert client.get("/health").status_code == 200  # kept alive
    first.shut_down(kill=True)
    for client in clients:
        client.close()  # the server's end of each goes to TIME_WAIT
    second = start_server(tmp_path / "state", port=first.port, token=first.token)
    with second.client() as client:
        assert client.get("/health").status_code == 200
