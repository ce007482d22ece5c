"""A port in use is one line, before anything starts: no journal lock taken, no fork server, no traceback. A signal
during start-up ends it at once, and leaves nothing behind."""

from __future__ import annotations

import signal
import socket
import subprocess
from pathlib import Path

import psutil
import pytest

from supervisor.journal.store import Journal
from tests.conftest import gone, start_server, wait_until

EXIT_SECONDS = 60.0  # the refusal comes before any child: seconds even at load 10; more is a hang


def test_a_port_in_use_is_refused_in_one_line_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = start_server(tmp_path / "state", port=port, wait=False)
        try:
            returncode = server.process.wait(EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            server.kill()
            raise AssertionError("a supervisor on a port in use did not exit") from None
    lines = server.log_tail().strip().splitlines()
    assert returncode == 1
    assert lines == [f"crew-supervisor: cannot listen on 127.0.0.1:{port}: Address already in use"], lines
    assert not (tmp_path / "state").exists()  # refused before the state directory was even made


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
