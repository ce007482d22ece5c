"""What a job's sandbox hides and lets it change, and what WORKER_SANDBOX does with a kernel that lacks a layer."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from protocol import Layer
from supervisor.config import ConfigError, Settings, load
from supervisor.jobs.sandbox import Sandbox, check_places, hidden

EVERY = [str(layer) for layer in Layer]
OLD_KERNEL = [Layer.SECCOMP, Layer.FILESYSTEM, Layer.PROCESSES]  # Landlock ABI 2 to 5
ENV = {"HOME": "/state/home/a", "CREWAI_STORAGE_DIR": "/state/storage/a", "TMPDIR": "/state/scratch/job-1/tmp"}


def _settings(tmp_path: Path, **extra: str) -> Settings:
    env = {
        "AIP_CREWAI_REGISTRY": "worker.demo:registry",
        "AIP_CREWAI_BEARER_TOKEN": "t0ken",
        "AIP_CREWAI_STATE_FILE": "/state/journal.db",
        **{f"AIP_CREWAI_{name}": value for name, value in extra.items()},
    }
    return load({}, env)


def test_a_job_writes_its_own_places_and_reads_no_state_token_env_files_or_training(tmp_path: Path) -> None:
    (tmp_path / "training").mkdir(mode=0o700)
    (tmp_path / "crews").mkdir(mode=0o700)
    settings = _settings(tmp_path, CREW_ENV_DIR=str(tmp_path / "crews"), TRAINING_DIR=str(tmp_path / "training"))
    assert hidden(settings, Path("/state")) == ["/state", str(tmp_path / "crews"), str(tmp_path / "training")]
    sandbox = Sandbox(settings, EVERY)
    places = ["/state/scratch/job-1", "/state/home/a", "/state/storage/a"]  # TMPDIR is in the scratch directory
    assert sandbox.policy(ENV, "/state/scratch/job-1", "run") == places
    assert sandbox.policy(ENV, "/state/scratch/job-1", "train") == [*places, str(tmp_path / "training")]


def test_off_gives_no_policy_and_keeps_the_filter(tmp_path: Path) -> None:
    settings = _settings(tmp_path, WORKER_SANDBOX="off")
    sandbox = Sandbox(settings, EVERY)
    assert hidden(settings, Path("/state")) == [] and sandbox.policy(ENV, "/state/scratch/job-1", "run") is None
    assert sandbox.health() == {"mode": "off", "layers": ["seccomp"], "missing": []}


def test_enforce_refuses_a_kernel_without_every_layer_naming_what_brings_each(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        Sandbox(_settings(tmp_path, WORKER_SANDBOX="enforce"), OLD_KERNEL).check()
    assert str(refused.value) == (
        "AIP_CREWAI_WORKER_SANDBOX=enforce, but this kernel gives a job no signals (Landlock ABI 6),"
        " abstract sockets (Landlock ABI 6)"
    )
    assert "Linux 6.12" in refused.value.fix
    Sandbox(_settings(tmp_path, WORKER_SANDBOX="enforce"), EVERY).check()  # every layer: it serves


def test_auto_serves_with_what_the_kernel_has_and_says_what_is_missing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sandbox = Sandbox(_settings(tmp_path), OLD_KERNEL)
    with caplog.at_level(logging.INFO, "crew_supervisor"):
        sandbox.check()
    assert caplog.messages == [
        "a job's sandbox: seccomp, filesystem, processes; this kernel gives a job no signals (Landlock ABI 6),"
        " abstract sockets (Landlock ABI 6)"
    ]
    assert sandbox.health() == {"mode": "auto", "layers": OLD_KERNEL, "missing": ["signals", "abstract sockets"]}


@pytest.mark.parametrize("writable", ["state", "state/out", ""])
def test_a_writable_directory_holding_or_beneath_the_state_is_refused(tmp_path: Path, writable: str) -> None:
    state = tmp_path / "state"
    (state / "out").mkdir(parents=True)
    place = str(tmp_path / writable)
    with pytest.raises(ConfigError) as refused:
        check_places(_settings(tmp_path, WORKER_WRITABLE=place), state)
    assert str(refused.value) == f"AIP_CREWAI_WORKER_WRITABLE: {place} would let every job change or read {state}"


def test_a_writable_directory_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        check_places(_settings(tmp_path, WORKER_WRITABLE=str(tmp_path / "out")), tmp_path / "state")
    assert str(refused.value) == f"AIP_CREWAI_WORKER_WRITABLE: {tmp_path / 'out'} is not a directory"


def test_a_training_directory_holding_the_state_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with pytest.raises(ConfigError) as refused:
        check_places(_settings(tmp_path, TRAINING_DIR=str(tmp_path)), state)
    assert str(refused.value).startswith(f"AIP_CREWAI_TRAINING_DIR: {tmp_path} would let every job change or read")
    check_places(_settings(tmp_path, TRAINING_DIR=str(tmp_path / "training")), state)  # apart: fine


def test_every_job_may_change_the_shared_directories_too(tmp_path: Path) -> None:
    sandbox = Sandbox(_settings(tmp_path, WORKER_WRITABLE="/srv/out, /srv/cache"), EVERY)
    assert sandbox.policy(ENV, "/j", "run") == ["/j", ENV["HOME"], ENV["CREWAI_STORAGE_DIR"], "/srv/out", "/srv/cache"]
