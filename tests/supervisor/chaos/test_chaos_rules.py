"""The chaos harness's own rules must be able to fail: an answer that breaks idempotency, a kill that did
not happen, a failure nobody caused."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

import httpx
import psutil
import pytest

from supervisor.chaos import faults
from supervisor.chaos import flags as flags_module
from supervisor.chaos.baseline import baseline_bodies, run_baseline
from supervisor.chaos.checks import Seen, job_problems, survivor
from supervisor.chaos.crews import Crews
from supervisor.chaos.faults import Record
from supervisor.chaos.load import cancel_problem, conflict_problem, repeat_problem, start_problem


def test_an_exact_repeat_answers_only_its_own_job() -> None:
    cancelled = {"detail": "run was cancelled", "action_id": "a", "status": "cancelled"}
    assert repeat_problem("a", 409, cancelled, "cancelled") is None
    assert repeat_problem("a", 200, {"raw": "x"}, "completed") is None
    assert repeat_problem("a", 502, {**cancelled, "status": "failed"}, "failed") is None
    assert repeat_problem("a", 504, {**cancelled, "status": "running"}, "completed") is None  # it ended since
    # A 409 for conflicting material (a request-hash regression) is not the job cancelled.
    conflict = {"detail": "action id was already admitted with different request material"}
    assert repeat_problem("a", 409, conflict, "completed")
    assert repeat_problem("a", 409, {**cancelled, "action_id": "b"}, "cancelled")  # another job's answer
    assert repeat_problem("a", 409, {**cancelled, "status": "completed"}, "completed")
    assert repeat_problem("a", 409, cancelled, "completed")  # the body says what the journal does not
    assert repeat_problem("a", 200, {"raw": "x"}, "running")  # an output for a job still running
    assert repeat_problem("a", 500, {}, None)


def test_a_conflicting_repeat_is_refused_not_answered_with_the_job() -> None:
    assert (
        conflict_problem("a", 409, {"detail": "action id was already admitted with different request material"}) is None
    )
    assert conflict_problem("a", 200, {"raw": "x"})
    assert conflict_problem("a", 409, {"detail": "run was cancelled", "action_id": "a", "status": "cancelled"})


def test_a_refused_start_is_right_only_when_the_disk_was_full() -> None:
    assert start_problem("a", 200, False) is None
    assert start_problem("a", 507, True) is None
    assert start_problem("a", 507, False)
    assert start_problem("a", 503, True)


def test_a_cancel_answers_its_job_once_terminal() -> None:
    assert cancel_problem("a", 200, {"action_id": "a", "status": "cancelled"}) is None
    assert cancel_problem("a", 200, {"action_id": "a", "status": "running"})
    assert cancel_problem("a", 200, {"action_id": "b", "status": "cancelled"})
    assert cancel_problem("a", 404, {"detail": "run was not found"})


def events(*names: str, **terminal: object) -> list[dict[str, object]]:
    return [
        {"event": name, "sequence": i, "data": terminal if i == len(names) - 1 else {}} for i, name in enumerate(names)
    ]


def test_a_job_read_back_must_be_whole_and_its_failure_ours() -> None:
    record = Record(killed_pids={42})
    job = {"status": "failed", "event_count": 3}
    crashed = {"reason": "supervisor_restarted", "uncertain_outcome": True}
    assert job_problems("a", job, events("started", "chunk", "failed", **crashed), record) == []
    assert job_problems("a", job, events("started", "chunk", "failed", reason="worker_killed", pid=42), record) == []
    assert job_problems("a", job, events("started", "chunk", "failed", reason="worker_killed", pid=7), record)
    assert job_problems(
        "a", job, events("started", "chunk", "failed", **{**crashed, "uncertain_outcome": False}), record
    )
    # The crew's own outcome, not ours: it raised (CrewAI's storage on a full disk too), or left processes running.
    for reason in ("operation_failed", "crew_factory_failed", "stray_processes"):
        assert job_problems("a", job, events("started", "chunk", "failed", reason=reason), record) == []
    # A reason only the supervisor gives, none of its faults explaining it, or one a worker finds before the crew
    # runs (its sandbox, its registry): ours, forged or not.
    for reason in ("memory_limit_exceeded", "protocol_error", "timeout", "sandbox_failed", "registry_error"):
        assert job_problems("a", job, events("started", "chunk", "failed", reason=reason), record)
    assert job_problems("a", job, events("started", "started", "failed", **crashed), record)  # a second worker
    assert job_problems("a", job, events("started", "completed", "failed", **crashed), record)  # two terminals
    assert job_problems("a", {**job, "event_count": 4}, events("started", "chunk", "failed", **crashed), record)
    assert job_problems("a", {**job, "status": "running"}, events("started", "chunk", "failed", **crashed), record)


def test_a_kill_counts_only_once_the_process_is_dead() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    process = psutil.Process(child.pid)
    assert faults.kill(process)  # dead (a zombie until we reap it)
    child.wait()
    assert not faults.kill(process)  # gone: nothing was delivered, nothing counts


def test_a_process_that_outlives_the_signal_is_not_confirmed_dead() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        assert not faults.dead(psutil.Process(child.pid), timeout=0.2)
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("name", ["nope", "disk"])
def test_faults_are_checked_before_anything_starts(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    from supervisor import cli

    with pytest.raises(SystemExit) as exited:
        cli.main(["chaos", "--faults", name])
    assert exited.value.code == 2
    assert ("unknown fault" if name == "nope" else "needs --small-disk") in capsys.readouterr().out


def test_a_survivor_of_the_restart_says_what_it_is_and_what_last_touched_its_tree() -> None:
    # A process tree as chaos notes it before the kill: us (the "supervisor"), a child, its grandchild.
    child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.run(['sleep', '60'])"])
    try:
        me = psutil.Process()
        # Named sleep once it has exec'd: until then it is a copy of its parent.
        assert faults._until(lambda: [p.name() for p in psutil.Process(child.pid).children()] == ["sleep"])
        grandchild = psutil.Process(child.pid).children()[0]
        before = [Seen.of(psutil.Process(child.pid)), Seen.of(grandchild)]
        record = Record()
        record.aim("freeze", me.pid)
        line = survivor(before[1], grandchild, grandchild.status(), before, record)
        assert line.startswith(f"process {grandchild.pid} from before the restart is alive: sleep (sleep 60), ")
        assert f"parent {child.pid} then, {child.pid} now" in line
        assert line.endswith(f"last fault on its tree: freeze of {me.pid}")
        record.aim("worker kill", child.pid)  # nearer the survivor: named first
        assert survivor(before[1], grandchild, "sleeping", before, record).endswith(f"worker kill of {child.pid}")
    finally:
        for process in psutil.Process(child.pid).children():
            process.kill()
        child.kill()
        child.wait()


@pytest.mark.parametrize(
    ("flags", "faults_"),
    [
        ([], ["supervisor", "worker", "forkserver", "freeze"]),  # as typed: nothing that needs root
        (["--small-disk", "64"], ["supervisor", "worker", "forkserver", "freeze", "disk"]),
        (["--url", "http://127.0.0.1:1", "--restart-cmd", "true"], ["supervisor"]),
        (["--faults", "worker, freeze"], ["worker", "freeze"]),
    ],
)
def test_the_default_faults_are_those_the_run_can_inject(flags: list[str], faults_: list[str]) -> None:
    parser = argparse.ArgumentParser()
    flags_module.add_arguments(parser)
    args = parser.parse_args(flags)
    assert flags_module.chosen_faults(args) == faults_
    assert flags_module.refusal(args, faults_) is None


def test_each_crew_gets_its_input_with_the_seconds_put_in() -> None:
    crews = Crews("research", "watch", '{"topic": "a"}', '{"topic": "b", "seconds": {seconds}, "then": "{seconds}s"}')
    assert crews.input(False, 0) == {"topic": "a"}
    assert crews.input(True, 5) == {"topic": "b", "seconds": 5, "then": "5s"}
    assert Crews().input(True, 2) == {"seconds": 2} and Crews().input(False, 0) == {}  # the demo crews'


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        ("--fast-input", "[]", "--fast-input must be a JSON object"),
        ("--slow-input", '{"seconds": seconds}', "--slow-input must be a JSON object"),
        ("--slow-input", "nope", "({seconds} where the seconds go)"),
    ],
)
def test_an_input_that_is_no_json_object_is_refused_before_anything_starts(
    flag: str, value: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from supervisor import cli

    with pytest.raises(SystemExit) as exited:
        cli.main(["chaos", flag, value])
    assert exited.value.code == 2 and said in capsys.readouterr().out


def test_the_baseline_starts_each_crew_once_and_keeps_each_job_admitted() -> None:
    """One job of each crew run to its end before the load: each admitted one (whatever its end: its record's rules
    are the checks') is kept for them; a start refused or not answered in time is a finding of its own."""
    bodies = baseline_bodies(Crews("research", "watch", '{"topic": "a"}', '{"seconds": {seconds}}', "effects"))
    assert [(body["crew_id"], body["input"]) for body in bodies[:2]] == [
        ("research", {"topic": "a"}),
        ("watch", {"seconds": 1}),
    ]
    assert bodies[2]["crew_id"] == "effects" and bodies[2]["input"]["marker"] == bodies[2]["action_id"]
    assert len({body["action_id"] for body in bodies}) == 3
    assert [body["crew_id"] for body in baseline_bodies(Crews(effects=""))] == ["demo", "demo-slow"]

    answers = {"research": 200, "watch": 502, "effects": 503}

    def answer(request: httpx.Request) -> httpx.Response:
        crew = json.loads(request.content)["crew_id"]
        if crew == "late":
            raise httpx.ReadTimeout("no answer", request=request)
        return httpx.Response(answers[crew], json={"detail": "as scripted"})

    acked: dict[str, dict[str, Any]] = {}
    with httpx.Client(base_url="http://chaos", transport=httpx.MockTransport(answer)) as client:
        problems = run_baseline(client, [*bodies, {**bodies[0], "crew_id": "late", "action_id": "x"}], acked)
    assert list(acked) == [bodies[0]["action_id"], bodies[1]["action_id"]]  # the failed one too: the checks judge it
    assert len(problems) == 2
    assert problems[0].startswith(f"baseline start of {bodies[2]['action_id']} answered 503")
    assert problems[1] == "baseline job x of late did not end in 120 s"
