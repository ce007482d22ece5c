"""A crew's environment file, parsed: NAME=VALUE lines, comments, values as written; a bad line named, never quoted.
And what of the supervisor's own environment a job never gets: its tracing's ``OTEL_*``, whatever WORKER_ENV says."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from supervisor.jobs.environment import MAX_FILE_BYTES, CrewEnvError, job_env, parse_crew_env, read_crew_env
from tests.supervisor.jobs.harness import settings


def test_lines_comments_and_values_as_written() -> None:
    text = b'# a comment\n\n  OPENAI_API_KEY = sk-1=2 \r\nQUOTED="kept"\nEXPANDED=$HOME\nEMPTY=\n'
    assert parse_crew_env("f", text) == {
        "OPENAI_API_KEY": "sk-1=2",
        "QUOTED": '"kept"',
        "EXPANDED": "$HOME",
        "EMPTY": "",
    }


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (b"A=1\nnot a line sk-hidden\n", "f, line 2: not NAME=VALUE"),
        (b"1A=sk-hidden\n", "f, line 1: not NAME=VALUE"),
        (b"TMPDIR=/tmp\n", "f, line 1: TMPDIR is the supervisor's to set"),
        (b"OTEL_EXPORTER_OTLP_HEADERS=key=sk-hidden\n", "f, line 1: OTEL_EXPORTER_OTLP_HEADERS is the supervisor's"),
        (b"A=\xff\n", "f: not UTF-8"),
        (b"A=sk-hidden\0\n", "f, line 1: A's value holds a NUL byte"),
    ],
)
def test_a_bad_line_is_named_not_quoted(data: bytes, said: str) -> None:
    with pytest.raises(CrewEnvError) as caught:
        parse_crew_env("f", data)
    assert str(caught.value).startswith(said) and "sk-hidden" not in str(caught.value)


def test_no_file_is_read_for_a_crew_id_that_cannot_name_one(tmp_path: Path) -> None:
    (tmp_path / "x.env").write_text("A=1\n")
    (tmp_path / ".env").write_text("A=1\n")
    assert read_crew_env(str(tmp_path), "x") == {"A": "1"}
    assert [read_crew_env(str(tmp_path), crew) for crew in ("", "../x", "a/b", ".hidden", "x y")] == [{}] * 5
    assert read_crew_env("", "x") == {} and read_crew_env(str(tmp_path), "absent") == {}


def test_a_fifo_or_a_large_file_is_refused_without_waiting(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo.env", 0o600)
    with pytest.raises(CrewEnvError, match="not a regular file"):
        read_crew_env(str(tmp_path), "fifo")
    (tmp_path / "big.env").write_text("A=" + "x" * MAX_FILE_BYTES)
    with pytest.raises(CrewEnvError, match="larger than"):
        read_crew_env(str(tmp_path), "big")


def test_reading_a_small_file_takes_well_under_a_millisecond(tmp_path: Path) -> None:
    """It is read at every job's start, on the supervisor's loop (measured here: ~20-40 µs)."""
    (tmp_path / "crew.env").write_text("# keys\n" + "".join(f"KEY_{i}=sk-{i:040d}\n" for i in range(20)))
    runs = 200
    began = time.perf_counter()
    for _ in range(runs):
        read_crew_env(str(tmp_path), "crew")
    assert (time.perf_counter() - began) / runs < 0.001


@pytest.mark.parametrize("worker_env", ["", "OTEL_*,KEPT", "OTEL_EXPORTER_OTLP_HEADERS,KEPT"])
def test_no_otel_variable_reaches_a_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, worker_env: str) -> None:
    """The exporter's endpoint and headers (a vendor's key, say) are the supervisor's: a job's worker sends its spans
    as frames. Not even WORKER_ENV can name one back."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=sk-hidden")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "sidecar")
    monkeypatch.setenv("KEPT", "1")
    env = job_env(settings(tmp_path / "journal.db", worker_env=worker_env), tmp_path, "crew", tmp_path / "tmp")
    assert env["KEPT"] == "1" and not [name for name in env if name.startswith("OTEL_")]
