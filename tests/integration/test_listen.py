"""A port in use is one line, before anything starts: no journal lock taken, no fork server, no traceback."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

from tests.conftest import start_server

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
