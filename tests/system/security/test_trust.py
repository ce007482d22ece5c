"""Crews are trusted code, but a crew's worker can no longer reach into the supervisor or the fork server.

A crew probes from inside its own worker (``tests/crews/prober.py``): the supervisor's and the fork server's
/proc/<pid>/environ, PTRACE_ATTACH and pidfd_getfd all answer EACCES/EPERM; the supervisor's token is in
neither its own environment block nor the worker's; a descriptor the supervisor's launcher leaked to it
reaches neither the fork server nor a worker. This machine runs the tests as root, so it also shows that
a root worker's capabilities (CAP_SYS_PTRACE, CAP_SYS_ADMIN and CAP_PERFMON each override the
supervisor's non-dumpable flag) are gone.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import start_server

DENIED = {"EACCES", "EPERM"}


@pytest.mark.parametrize("launcher", ["forkserver", "spawn"])
def test_a_worker_cannot_read_attach_to_or_inherit_from_the_supervisor(tmp_path: Path, launcher: str) -> None:
    marker = tmp_path / "leaked-by-the-launcher"
    leaked = os.open(marker, os.O_RDONLY | os.O_CREAT, 0o600)
    os.set_inheritable(leaked, True)  # as a careless launcher leaves one: not close-on-exec
    try:
        server = start_server(tmp_path / "state", pass_fds=[leaked], env={"AIP_CREWAI_LAUNCHER": launcher})
    finally:
        os.close(leaked)
    try:
        forkserver = server.forkserver()
        assert (forkserver is not None) == (launcher == "forkserver")
        targets = {"supervisor": server.pid, **({"forkserver": forkserver.pid} if forkserver else {})}
        with server.client() as client:
            response = client.post(
                "/jobs",
                json={"crew_id": "prober", "action_id": "probe", "input": {"targets": targets}},
                headers={"Idempotency-Key": "probe"},
            )
            assert response.status_code == 200, response.text
        found = json.loads(response.json()["raw"])

        for name, outcome in found["targets"].items():
            assert set(outcome.values()) <= DENIED, (name, outcome)
        # The supervisor did receive the leaked descriptor, and kept it; its children did not.
        assert str(marker) in _descriptors(server.pid)
        assert str(marker) not in found["fds"].values()
        if forkserver is not None:
            assert str(marker) not in _descriptors(forkserver.pid)
        # The token was read and is gone: from the supervisor's environment block (as root, this test can
        # still read it) and from the worker's.
        assert server.token.encode() not in Path(f"/proc/{server.pid}/environ").read_bytes()
        assert not [name for name in found["env"] if "BEARER_TOKEN" in name]
        # The worker itself stays dumpable (debuggable, measurable by a non-root supervisor).
        assert found["dumpable"] == 1
    finally:
        server.stop()


def _descriptors(pid: int) -> set[str]:
    links = set()
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            links.add(os.readlink(f"/proc/{pid}/fd/{name}"))
        except OSError:
            continue  # closed meanwhile
    return links
