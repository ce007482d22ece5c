"""The two scripts the image ships: the bearer-auth health probe and the Kubernetes init step."""

from __future__ import annotations

import http.server
import json
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.testing import free_port
from tests.conftest import start_server, wait_until

ROOT = Path(__file__).resolve().parents[3]
HEALTHCHECK = ROOT / "container" / "healthcheck.py"
PREPARE = ROOT / "container" / "prepare.py"
TOKEN = "probe-token-0123456789"


def run(script: Path, *args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ["PATH"]}  # nothing else of ours: no AIP_CREWAI_* leaking in from the test run
    return subprocess.run(
        [sys.executable, str(script), *map(str, args)], env={**base, **(env or {})}, capture_output=True, text=True
    )


def token_file(tmp_path: Path, token: str = TOKEN) -> Path:
    path = tmp_path / "token"
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


class FakeSupervisor(http.server.BaseHTTPRequestHandler):
    """/health behind the same exact-header check the supervisor makes."""

    status = "ready"

    def do_GET(self) -> None:
        if self.path != "/health" or self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self.send_response(401)
            self.end_headers()
            return
        body = json.dumps({"status": self.status}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fake() -> Iterator[http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeSupervisor)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()
    FakeSupervisor.status = "ready"


def probe_env(port: int, token: Path, **extra: str) -> dict[str, str]:
    return {
        "AIP_CREWAI_HOST": "0.0.0.0",
        "AIP_CREWAI_PORT": str(port),
        "AIP_CREWAI_BEARER_TOKEN_FILE": str(token),
        **extra,
    }


def test_healthcheck_sends_the_token_from_the_file(fake: http.server.ThreadingHTTPServer, tmp_path: Path) -> None:
    # A proxy in the environment must not capture a loopback probe.
    env = probe_env(
        fake.server_port, token_file(tmp_path), HTTP_PROXY="http://127.0.0.1:9", http_proxy="http://127.0.0.1:9"
    )
    result = run(HEALTHCHECK, env=env)
    assert result.returncode == 0, result.stderr


def test_healthcheck_fails_on_a_wrong_token_without_printing_it(
    fake: http.server.ThreadingHTTPServer, tmp_path: Path
) -> None:
    result = run(HEALTHCHECK, env=probe_env(fake.server_port, token_file(tmp_path, "not-the-token")))
    assert result.returncode == 1
    assert "HTTP 401" in result.stderr
    assert "not-the-token" not in result.stderr + result.stdout


def test_healthcheck_fails_when_not_ready_or_not_there(fake: http.server.ThreadingHTTPServer, tmp_path: Path) -> None:
    FakeSupervisor.status = "starting"
    assert run(HEALTHCHECK, env=probe_env(fake.server_port, token_file(tmp_path))).returncode == 1
    assert run(HEALTHCHECK, env=probe_env(free_port(), token_file(tmp_path))).returncode == 1
    assert run(HEALTHCHECK, env=probe_env(fake.server_port, tmp_path / "missing")).returncode == 1


def test_healthcheck_against_the_real_supervisor(tmp_path: Path) -> None:
    """The probe as the image runs it: token from a 0600 file, /health on loopback, with real bearer auth."""
    token = token_file(tmp_path)
    env = {"AIP_CREWAI_BEARER_TOKEN": "", "AIP_CREWAI_BEARER_TOKEN_FILE": str(token)}
    server = start_server(tmp_path / "state", env=env, wait=False)
    try:
        port = int(server.url.rsplit(":", 1)[1])
        ok = wait_until(lambda: run(HEALTHCHECK, env=probe_env(port, token)).returncode == 0, timeout=90, interval=0.5)
        assert ok, server.log.read_text()[-2000:]
        (tmp_path / "other").mkdir()
        wrong = run(HEALTHCHECK, env=probe_env(port, token_file(tmp_path / "other", "wrong-token")))
        assert wrong.returncode == 1 and "HTTP 401" in wrong.stderr
    finally:
        server.stop()


def _secret_volume(tmp_path: Path, token: str = TOKEN) -> Path:
    """The kubelet's layout: token -> ..data/token -> ..<timestamp>/token, group-readable under fsGroup."""
    volume = tmp_path / "secret"
    (volume / "..2026_01_01").mkdir(parents=True)
    (volume / "..2026_01_01" / "token").write_text(token)
    (volume / "..2026_01_01" / "token").chmod(0o440)
    (volume / "..data").symlink_to("..2026_01_01")
    (volume / "token").symlink_to("..data/token")
    return volume / "token"


def test_prepare_copies_the_token_as_a_regular_owner_only_file(tmp_path: Path) -> None:
    source = _secret_volume(tmp_path)
    dest = tmp_path / "token-dir" / "token"
    dest.parent.mkdir()
    assert run(PREPARE, "--token", source, dest).returncode == 0
    info = os.lstat(dest)
    assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o400
    assert dest.read_text() == TOKEN
    # A restarted pod keeps its emptyDir: the copy is replaced, never appended to, and no temporary is left.
    source.parent.joinpath("token").chmod(0o640)
    source.parent.joinpath("token").write_text("rotated-token")
    assert run(PREPARE, "--token", source, dest).returncode == 0
    assert dest.read_text() == "rotated-token"
    assert sorted(p.name for p in dest.parent.iterdir()) == ["token"]


def test_prepare_refuses_an_empty_token(tmp_path: Path) -> None:
    source = _secret_volume(tmp_path, token="\n")
    result = run(PREPARE, "--token", source, tmp_path / "token")
    assert result.returncode != 0 and "empty" in result.stderr
    assert not (tmp_path / "token").exists()


def test_prepare_makes_private_directories(tmp_path: Path) -> None:
    loose = tmp_path / "state"
    loose.mkdir()
    loose.chmod(0o2770)  # what the kubelet's fsGroup pass leaves behind
    fresh = tmp_path / "volume" / "training"
    assert run(PREPARE, "--directory", loose, "--directory", fresh).returncode == 0
    for path in (loose, fresh):
        assert stat.S_IMODE(os.lstat(path).st_mode) & 0o077 == 0
    (tmp_path / "link").symlink_to(loose)
    assert run(PREPARE, "--directory", tmp_path / "link").returncode != 0
