"""``crew-supervisor doctor`` as a subprocess, against real files, a real worker and the kernel's cgroups."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from protocol import QUIET_CREWAI
from supervisor.journal.records import Job
from supervisor.journal.store import Journal
from supervisor.testing import free_port
from tests.conftest import ROOT
from worker import landlock
from worker.landlock import SCOPED_SINCE

DOCTOR_SECONDS = 300  # two crew-building workers may import CrewAI at once on a loaded machine
# Imports no CrewAI, so the checks that are not about crews stay quick.
LIGHT_REGISTRY = """
class Plain:
    def kickoff(self, inputs=None):
        return None


registry = {"plain": Plain}
"""
MiB = 1024 * 1024
MAX_MIN_FREE_DISK_MB = 1 << 20  # the setting's bound


@dataclasses.dataclass
class Deployment:
    state: Path
    token: Path
    env: dict[str, str]
    cwd: Path


@dataclasses.dataclass
class Answer:
    code: int
    out: str
    err: str
    pid: int

    def lines(self, status: str) -> list[str]:
        return [line for line in self.out.splitlines() if line.split(" ", 1)[0] == status]


@pytest.fixture
def deployment(tmp_path: Path) -> Deployment:
    return deployment_in(tmp_path)


def deployment_in(tmp_path: Path) -> Deployment:
    """A state directory (0700; a supervisor's, if one made it there already), a token file (0600) and a registry
    of one crew that imports no CrewAI, in a clean environment: no AIP_CREWAI_* setting and no telemetry switch
    but what a test sets, and WARMUP=offline (its crews are offline, as the suite's supervisors; the good
    deployment's run has the default)."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700, exist_ok=True)
    token = tmp_path / "token"
    token.write_text("a-token-for-the-doctor\n")
    token.chmod(0o600)
    (tmp_path / "light_crews.py").write_text(LIGHT_REGISTRY)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIP_CREWAI_") and k not in QUIET_CREWAI}
    env.update(
        PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]),
        AIP_CREWAI_REGISTRY="light_crews:registry",
        AIP_CREWAI_STATE_FILE=str(state / "journal.db"),
        AIP_CREWAI_BEARER_TOKEN_FILE=str(token),
        AIP_CREWAI_PORT=str(free_port()),  # its own: the listen check must not meet another test's
        AIP_CREWAI_WARMUP="offline",
    )
    return Deployment(state, token, env, tmp_path)


def doctor(deployment: Deployment, *args: str, command: str = "doctor") -> Answer:
    """Run from outside the checkout, so that only PYTHONPATH decides what ``supervisor`` and the rest are."""
    process = subprocess.Popen(
        [sys.executable, "-m", "supervisor", command, *args],
        env=deployment.env,
        cwd=deployment.cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = process.communicate(timeout=DOCTOR_SECONDS)
    return Answer(process.returncode, out, err, process.pid)


def documented_checks() -> list[str]:
    """The check names of docs/operating.md's doctor table, in its order."""
    text = (ROOT / "docs" / "operating.md").read_text()
    table = text.split("| Check | What it looks at |", 1)[1].split("\n\n", 1)[0]
    return [name for line in table.splitlines()[2:] for name in re.findall(r"`([a-z -]+)`", line.split(" | ")[0])]


def findings(answer: Answer) -> list[dict[str, Any]]:
    return list(orjson.loads(answer.out))


def test_a_good_deployment_is_ready(deployment: Deployment) -> None:
    del deployment.env["AIP_CREWAI_WARMUP"]  # the default: the providers warmed too
    # What is there before: a supervisor killed in another test may have left its cgroups under a pid the doctor
    # is then given (pids wrap at 32,768 here), which is not the doctor's to remove.
    before = set(Path("/sys/fs/cgroup").glob("**/crew-supervisor-*"))
    answer = doctor(deployment, "--demo", "--json")
    assert answer.code == 0, answer.out + answer.err
    found = findings(answer)
    assert {f["status"] for f in found} <= {"ok", "warning"}
    checks = [f["check"] for f in found]
    assert checks == [
        "names", "settings", "state", "journal", "token", "registry", "warm-up", "containment", "sandbox",
        "telemetry", "tracing",
        "listen", "cgroups", "rlimits", "llm budget", "disk",
    ]  # fmt: skip
    assert [name for name in documented_checks() if name in checks] == checks  # docs/operating.md's table, in order
    containment = next(f for f in found if f["check"] == "containment")
    if os.geteuid() == 0:  # root makes a cgroup per job here, and the workers cannot leave it (Landlock)
        assert containment["status"] == "ok" and containment["detail"].startswith("cgroup: "), containment
    sandbox = next(f for f in found if f["check"] == "sandbox")
    if landlock.abi() >= SCOPED_SINCE:  # this machine's kernel: every layer
        assert sandbox["status"] == "ok" and sandbox["detail"].startswith("seccomp, filesystem, processes, signals")
    tracing = next(f for f in found if f["check"] == "tracing")
    assert tracing["status"] == "ok" and tracing["detail"].startswith("off: no job is traced"), tracing
    budget = next(f for f in found if f["check"] == "llm budget")
    assert budget["detail"].startswith("per job: tokens unbounded (AIP_CREWAI_WORKER_MAX_TOKENS=0)")
    registry = next(f for f in found if f["check"] == "registry")
    assert registry["detail"].startswith("worker.demo:registry: 6 of 6 crews build")
    warm = next(f for f in found if f["check"] == "warm-up")
    assert warm["status"] == "ok" and warm["detail"].startswith("warms CrewAI offline, openai, openai-compatible; ")
    # The cgroups probe removed what it made: no directory of the doctor's pid is left that was not there before.
    assert set(Path("/sys/fs/cgroup").glob(f"**/crew-supervisor-{answer.pid}")) <= before
    assert not list(deployment.state.iterdir())  # nothing made in the state directory


def test_the_text_report_has_a_line_per_check_and_a_verdict(deployment: Deployment) -> None:
    """One line per check, ok or warning, then the verdict. A listable state directory is one of those warnings,
    not a problem: serve makes it private when it starts (the doctor changes nothing). The warm-up is ok though
    the registry imports no CrewAI (the native threads CrewAI's import starts are not left by the warm-up: OpenBLAS
    starts one per core but one, so a 1-core machine cannot show it), and says what WARMUP=offline leaves out."""
    deployment.state.chmod(0o755)
    answer = doctor(deployment)
    assert answer.code == 0, answer.out + answer.err
    lines = answer.out.splitlines()
    assert lines[-1].startswith("doctor: ready to serve")
    assert all(line.split(" ", 1)[0] in ("ok", "warning") for line in lines[:-1])
    assert "light_crews:registry: 1 of 1 crews build (plain)" in answer.out
    [warm_up] = [line for line in lines if line.split()[1] == "warm-up"]
    assert warm_up.startswith("ok ") and "warms CrewAI offline; " in warm_up, warm_up
    assert warm_up.endswith("not warmed: providers: AIP_CREWAI_WARMUP=offline"), warm_up
    [state] = [line for line in answer.lines("warning") if line.split()[1] == "state"]
    assert "has mode 0755: other users can list it; serve makes it 0700 when it starts" in state
    assert "fix: chmod 700 " in state
    assert deployment.state.stat().st_mode & 0o777 == 0o755


def _free_mib(path: Path) -> int:
    info = os.statvfs(path)
    return info.f_bavail * info.f_frsize // MiB


@pytest.mark.parametrize(
    ("case", "check", "fix"),
    [
        ("token file 0644", "settings", "fix: chmod 600 "),
        ("registry that does not import", "registry", "fix: make no_such_crews importable by the workers"),
        (
            "registry without :attr",
            "registry",
            "fix: set AIP_CREWAI_REGISTRY to module:attr, the module and its mapping",
        ),
        ("registry naming no attribute", "registry", "fix: name in AIP_CREWAI_REGISTRY the attribute of tests.crews"),
    ],
)
def test_a_problem_that_stops_the_checks_is_one_line_with_its_fix(
    deployment: Deployment, case: str, check: str, fix: str
) -> None:
    """Settings, or a registry the workers cannot load: that one problem alone, with its fix."""
    if case == "token file 0644":
        deployment.token.chmod(0o644)
    elif case == "registry that does not import":
        deployment.env["AIP_CREWAI_REGISTRY"] = "no_such_crews:registry"
    elif case == "registry without :attr":
        deployment.env["AIP_CREWAI_REGISTRY"] = "tests.crews"
    elif case == "registry naming no attribute":
        deployment.env["AIP_CREWAI_REGISTRY"] = "tests.crews:no_such_registry"
    answer = doctor(deployment)
    assert answer.code == 1, answer.out + answer.err
    problems = answer.lines("problem")
    assert len(problems) == 1, answer.out
    assert problems[0].split()[1] == check
    assert fix in problems[0]
    assert "doctor: not ready (1 problem" in answer.out


def test_problems_found_together_are_each_one_line_with_its_fix(deployment: Deployment) -> None:
    """Four at once, each its own check's line: one doctor run (each builds the crews and rehearses the warm-up)."""
    expected = {
        "journal": "fix: stop that supervisor, or give this one another AIP_CREWAI_STATE_FILE",
        "telemetry": "fix: unset CREWAI_TRACING_ENABLED",
        "listen": "fix: stop what listens there (another supervisor?)",
        "disk": "or lower AIP_CREWAI_MIN_FREE_DISK_MB",
    }
    deployment.env["CREWAI_TRACING_ENABLED"] = "true"
    args: list[str] = []
    if _free_mib(deployment.state) < MAX_MIN_FREE_DISK_MB:
        args = ["--min-free-disk-mb", str(MAX_MIN_FREE_DISK_MB)]  # a flag, as serve takes it
    else:  # more free space than the setting can ask for
        del expected["disk"]
    with contextlib.ExitStack() as held:
        taken = held.enter_context(socket.socket())
        taken.bind(("127.0.0.1", int(deployment.env["AIP_CREWAI_PORT"])))
        taken.listen()
        # Held as a serving supervisor holds it: the journal's own lock.
        held.callback(Journal(deployment.state / "journal.db", checkpoint_events=1).close)
        answer = doctor(deployment, *args)
    assert answer.code == 1, answer.out + answer.err
    problems = {line.split()[1]: line for line in answer.lines("problem")}
    assert set(problems) == set(expected), answer.out
    for check, fix in expected.items():
        assert fix in problems[check], problems[check]
    assert f"doctor: not ready ({len(expected)} problems" in answer.out


def test_the_records_a_start_would_quarantine_and_those_it_did_are_named(deployment: Deployment) -> None:
    """Read without a change: the files beside the journal are the same before and after each run."""
    path = deployment.state / "journal.db"
    journal = Journal(path, checkpoint_events=1)
    for action_id in ("kept", "odd"):
        journal.admit(Job(action_id, "plain", "run", "hash", "running", 0)).wait()
    journal.close()
    with contextlib.closing(sqlite3.connect(path)) as db, db:  # a hand's edit
        db.execute("UPDATE jobs SET event_count = 2 WHERE action_id = 'odd'")
    files = sorted(deployment.state.iterdir())

    upcoming = records(doctor(deployment, "--json"))
    assert sorted(deployment.state.iterdir()) == files
    assert upcoming["status"] == "warning", upcoming
    said = "1 inconsistent, quarantined at serve's next start: 'odd' (event count differs from its events)"
    assert upcoming["detail"] == said

    Journal(path, checkpoint_events=1).close()  # a start: it quarantines
    files = sorted(deployment.state.iterdir())
    quarantined = records(doctor(deployment, "--json"))
    assert sorted(deployment.state.iterdir()) == files
    assert quarantined["status"] == "warning", quarantined
    said = "1 quarantined, kept aside with their action ids taken: 'odd' (event count differs from its events)"
    assert quarantined["detail"] == said and "quarantined_* tables" in quarantined["fix"]


def test_the_journal_s_capacity_and_oldest_record_are_read_without_a_change(deployment: Deployment) -> None:
    path = deployment.state / "journal.db"
    journal = Journal(path, checkpoint_events=1)
    for action_id in ("first", "second"):
        journal.admit(Job(action_id, "plain", "run", "hash", "running", 0)).wait()
        journal.finish(action_id, "completed", {"raw": "x"}).wait()
    journal.close()
    with contextlib.closing(sqlite3.connect(path)) as db, db:  # admitted at a known time: 2026-01-02 03:04:05 UTC
        db.execute("UPDATE jobs SET admitted_at = 1767323045.5 WHERE action_id = 'first'")
    files = sorted(deployment.state.iterdir())
    deployment.env["AIP_CREWAI_MAX_RETAINED_RUNS"] = "4"
    deployment.env["AIP_CREWAI_MAX_CONCURRENCY"] = "2"
    said = "2 of 4 records (AIP_CREWAI_MAX_RETAINED_RUNS), 0 of 256 MiB (AIP_CREWAI_MAX_STATE_BYTES);"
    said += " oldest admitted 2026-01-02T03:04:05+00:00; archived 604800 s after they end"
    assert capacity(doctor(deployment, "--json")) == {"check": "capacity", "status": "ok", "detail": said, "fix": ""}
    assert sorted(deployment.state.iterdir()) == files

    deployment.env.update(AIP_CREWAI_MAX_RETAINED_RUNS="2", AIP_CREWAI_ARCHIVE_AFTER_SECONDS="0")
    full = capacity(doctor(deployment, "--json"))
    assert full["status"] == "warning" and "2 of 2 records" in full["detail"], full
    assert "admission answers 507" in full["detail"] and "crew-supervisor archive --older-than" in full["fix"]


def capacity(answer: Answer) -> dict[str, Any]:
    assert answer.code == 0, answer.out + answer.err
    [found] = [f for f in findings(answer) if f["check"] == "capacity"]
    return found


def records(answer: Answer) -> dict[str, Any]:
    assert answer.code == 0, answer.out + answer.err  # a warning: serve serves
    [found] = [f for f in findings(answer) if f["check"] == "records"]
    return found


def test_a_crew_whose_factory_raises_is_named(deployment: Deployment) -> None:
    deployment.env["AIP_CREWAI_REGISTRY"] = "tests.crews:registry"
    answer = doctor(deployment, "--json")
    assert answer.code == 1, answer.out + answer.err
    problems = [f for f in findings(answer) if f["status"] == "problem"]
    assert problems == [
        {
            "check": "crew",
            "status": "problem",
            "detail": "crew 'broken-factory' does not build: ValueError: factory cannot build this crew",
            "fix": "correct its factory in tests.crews: every job of that crew fails until then",
        }
    ]
    registry = next(f for f in findings(answer) if f["check"] == "registry")
    # Counted from what the doctor names, so a crew added to tests.crews does not break this test.
    built, total, names = re.fullmatch(
        r"tests\.crews:registry: (\d+) of (\d+) crews build \((.*)\)", registry["detail"]
    ).groups()
    assert registry["status"] == "ok"
    assert int(built) == int(total) - 1 == len(names.split(", "))
    assert "broken-factory" not in names.split(", ")


def test_a_crew_instance_is_named_with_the_fix_its_jobs_give(deployment: Deployment) -> None:
    deployment.env["AIP_CREWAI_REGISTRY"] = "tests.crews.instance:registry"
    answer = doctor(deployment, "--json")
    assert answer.code == 1, answer.out + answer.err
    assert [f for f in findings(answer) if f["status"] == "problem"] == [
        {
            "check": "crew",
            "status": "problem",
            "detail": "crew 'instance' does not build: NotAFactory: registry value 'instance' is a Crew instance,"
            " not a zero-arg factory",
            "fix": "make 'instance' a zero-arg function that returns the Crew: registry = {'instance': make_instance}",
        }
    ]
    registry = next(f for f in findings(answer) if f["check"] == "registry")
    assert registry["detail"] == "tests.crews.instance:registry: 1 of 2 crews build (demo)"


REFUSES = "the fork server would refuse to start: "


@pytest.mark.parametrize(("kind", "says"), [("forkserver", REFUSES), ("spawn", "not used: ")])
def test_the_warm_up_says_whether_the_fork_server_would_refuse(deployment: Deployment, kind: str, says: str) -> None:
    """Here a crew's first emit starts a thread that never ends (the fork server's own test renames an
    attribute of CrewAI's event bus instead: tests/supervisor/processes/test_forkserver.py)."""
    deployment.env.update(AIP_CREWAI_REGISTRY="tests.crews.unwarmable:registry", AIP_CREWAI_LAUNCHER=kind)
    deployment.env["UNWARMABLE"] = "stuck"
    answer = doctor(deployment, "--json")
    warm = next(f for f in findings(answer) if f["check"] == "warm-up")
    assert warm["detail"].startswith(says), warm
    assert warm["status"] == ("warning" if kind == "forkserver" else "ok")
    if kind == "forkserver":
        assert (
            "threads still running after warm-up: never-ending" in warm["detail"] and "fresh interpreter" in warm["fix"]
        )


def test_a_shadowed_package_is_reported_before_anything_runs(deployment: Deployment) -> None:
    """Another distribution's ``protocol`` first on the path: the doctor still starts (its console script
    needs no protocol), says which package is whose, and runs nothing that would load the wrong code."""
    shadow = deployment.cwd / "elsewhere"
    (shadow / "protocol").mkdir(parents=True)
    (shadow / "protocol" / "__init__.py").write_text('"""Some other project\'s protocol package."""\n')
    deployment.env["PYTHONPATH"] = os.pathsep.join([str(shadow), deployment.env["PYTHONPATH"]])
    answer = doctor(deployment, "--json")
    assert answer.code == 1, answer.out + answer.err
    [finding] = findings(answer)
    assert finding["check"] == "names" and finding["status"] == "problem"
    assert f"the package protocol resolves to {shadow / 'protocol'}, not to {ROOT / 'protocol'}" == finding["detail"]
    assert "virtual environment of its own" in finding["fix"]
    other = doctor(deployment, command="jobs")  # any other command: refused in one line, before an ImportError
    assert (other.code, other.out) == (1, "")
    assert other.err == f"crew-supervisor: {finding['detail']}; fix: {finding['fix']}\n"


def test_another_distribution_of_one_of_our_names_is_reported(deployment: Deployment) -> None:
    """PyPI's supervisord installs a package named ``supervisor``: here its metadata, in a site directory
    after ours (so ours is still the one imported), as pip would leave it in a shared environment."""
    site = deployment.cwd / "site"
    record = site / "supervisor-4.2.5.dist-info"
    record.mkdir(parents=True)
    (record / "METADATA").write_text("Metadata-Version: 2.1\nName: supervisor\nVersion: 4.2.5\n")
    (record / "RECORD").write_text("supervisor/__init__.py,,\nsupervisor/supervisord.py,,\n")
    deployment.env["PYTHONPATH"] = os.pathsep.join([deployment.env["PYTHONPATH"], str(site)])
    answer = doctor(deployment)
    assert answer.code == 1, answer.out + answer.err
    [line] = answer.lines("problem")
    assert "names       the distribution supervisor 4.2.5 also installs supervisor; fix: install" in line


def test_the_tracing_line_names_the_exporter_and_the_endpoints_host_and_nothing_a_key_could_be_in(
    deployment: Deployment,
) -> None:
    """With the supervisor's tracing on (an endpoint alone; OTEL_SDK_DISABLED unset, as the workers set it for
    themselves), the line says the exporter and the endpoint's host, never its credentials, path or query, nor the
    headers; an exporter protocol ``serve`` would refuse is a problem in one line."""
    deployment.env.update(
        OTEL_EXPORTER_OTLP_ENDPOINT="http://someone:url-secret@collector.example:4318/tenant/url-path?key=url-query",
        OTEL_EXPORTER_OTLP_HEADERS="authorization=Bearer header-secret",
    )
    answer = doctor(deployment, "--json")
    assert answer.code == 0, answer.out + answer.err
    found = {f["check"]: f for f in findings(answer)}
    assert found["telemetry"]["status"] == "ok", found["telemetry"]
    assert found["tracing"] == {
        "check": "tracing",
        "status": "ok",
        "detail": "each job traced, sent over otlp/http to collector.example:4318",
        "fix": "",
    }
    assert not re.search("secret|url-path|url-query|someone", answer.out + answer.err)

    deployment.env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "carrier-pigeon"
    refused = doctor(deployment)
    assert refused.code == 1, refused.out + refused.err
    [line] = refused.lines("problem")
    assert line.split()[1] == "tracing" and "carrier-pigeon" in line and "secret" not in line, line


def test_an_endpoint_beside_otel_sdk_disabled_true_is_a_warning(deployment: Deployment) -> None:
    """CrewAI's docs name OTEL_SDK_DISABLED=true as a switch of its telemetry: on the supervisor it silences the
    traces an endpoint asks for, which the doctor says (no telemetry problem: the workers set it for themselves)."""
    deployment.env.update(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="http://collector.example:4318/v1/traces")
    deployment.env.update(OTEL_SDK_DISABLED="True")
    answer = doctor(deployment, "--json")
    assert answer.code == 0, answer.out + answer.err
    found = {f["check"]: f for f in findings(answer)}
    assert found["telemetry"]["status"] == "ok", found["telemetry"]
    tracing = found["tracing"]
    assert tracing["status"] == "warning" and "collector.example:4318" in tracing["detail"], tracing
    assert tracing["fix"].startswith("unset OTEL_SDK_DISABLED"), tracing
