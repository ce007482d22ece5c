"""The worker's environment contract (protocol.environment.WorkerSettings): what the supervisor writes is what the
worker reads, the worker takes every setting out of its environment, and a bad value names its variable."""

from __future__ import annotations

import dataclasses

import pytest

from protocol import MAX_EVENTS, SANDBOX_WRITABLE, SETTINGS_PREFIX, WORKER_IDS, BadSetting, WorkerSettings
from protocol.environment import RLIMITS

EVERY_FIELD = WorkerSettings(
    registry="tests.crews:registry",
    nice=10,
    warmup="offline",
    max_events=8000,
    max_event_bytes=4096,
    hidden=("/state", "/secret dir"),
    writable=("/state/home/x", "/state/storage/x"),
    ids=(1001, 1002),
    training_dir="/training",
    rlimits=(("RLIMIT_NOFILE", 1024), ("RLIMIT_FSIZE", 1 << 30)),
    cpu_backstop=65,
)


@pytest.mark.parametrize("settings", [WorkerSettings(), EVERY_FIELD], ids=["defaults", "every-field"])
def test_what_the_supervisor_writes_the_worker_reads(settings: WorkerSettings) -> None:
    assert WorkerSettings.from_environ(settings.to_environ()) == settings


def test_unset_ids_and_training_directory_are_not_written() -> None:
    written = WorkerSettings().to_environ()
    assert WORKER_IDS not in written and all(name.startswith(SETTINGS_PREFIX) for name in written)


def test_a_worker_run_alone_takes_the_defaults() -> None:
    assert WorkerSettings.from_environ({}) == WorkerSettings()


def test_taking_them_leaves_no_setting_in_the_environment() -> None:
    environ = {**EVERY_FIELD.to_environ(), "AIP_CREWAI_BEARER_TOKEN": "t", "PATH": "/bin"}
    assert WorkerSettings.take(environ) == EVERY_FIELD
    assert environ == {"PATH": "/bin"}


@pytest.mark.parametrize(
    ("name", "value"),
    [
        (MAX_EVENTS, "many"),
        (SANDBOX_WRITABLE, '{"a": 1}'),
        (SANDBOX_WRITABLE, "["),
        (WORKER_IDS, "7"),
        (RLIMITS, '{"NOFILE": 5}'),  # not a resource.RLIMIT_* name: the worker would look it up
        (RLIMITS, '{"RLIMIT_NOFILE": -1}'),
    ],
)
def test_a_bad_value_names_its_variable(name: str, value: str) -> None:
    with pytest.raises(BadSetting, match=f"^{name}="):
        WorkerSettings.from_environ({name: value})


def test_settings_taken_again_keep_those_the_environment_lacks() -> None:
    """A forked worker takes its Fork's settings over its fork server's; a job's Start carries none."""
    environ = {MAX_EVENTS: "5", "PATH": "/bin"}
    assert WorkerSettings.take(environ, EVERY_FIELD) == dataclasses.replace(EVERY_FIELD, max_events=5)
