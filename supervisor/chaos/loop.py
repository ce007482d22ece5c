"""The chaos loop and its report. Each iteration keeps the load going for a random while, injecting the
mid-run faults at random moments, then SIGKILLs the supervisor, restarts it on the same state and checks
the invariants; a last pass checks every job once more."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from supervisor import testing
from supervisor.chaos import faults
from supervisor.chaos.baseline import baseline_bodies, run_baseline
from supervisor.chaos.checks import Findings, Seen, check_restart
from supervisor.chaos.crews import Crews
from supervisor.chaos.disk import DiskUnavailable, SmallDisk
from supervisor.chaos.faults import Record
from supervisor.chaos.flags import ALL_FAULTS, RATES, chosen_faults, crews_of, refusal
from supervisor.chaos.load import Load
from supervisor.chaos.resume import resume_interrupted
from supervisor.chaos.targets import Deployment, Local, RestartError
from supervisor.console.client import OperatorError, resolve_target
from supervisor.testing import Server

Fault = Callable[[Server, random.Random, Record], bool]
TICK_SECONDS = 0.1
MID_RUN: dict[str, Fault] = {
    "worker": faults.kill_worker,
    "forkserver": faults.kill_forkserver,
    "freeze": faults.freeze,
}
# What chaos cannot see of a supervisor at --url, and so does not check.
OUT_OF_SIGHT = ("workers from before a restart are gone", "the journal passes SQLite's quick_check")


def run(args: argparse.Namespace) -> int:
    chosen = chosen_faults(args)
    problem = refusal(args, chosen)
    if problem:
        print(f"crew-supervisor chaos: {problem}")
        return 2
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    # A deployment at --url keeps its own state; a local supervisor's goes in --state, or in a temporary
    # directory of ours, removed after a clean run and kept (and said) after one that found something.
    mine = not args.url and args.state is None
    root = Path(tempfile.mkdtemp(prefix="crew-chaos-")) if mine else args.state
    code = 2  # until the run says otherwise: one cut short keeps its state
    try:
        code = _run_in(args, seed, chosen, root)
    finally:
        if mine and code == 0:
            shutil.rmtree(root, ignore_errors=True)
        elif mine:
            print(f"crew-supervisor chaos: kept {root} (the journal and supervisor.log) to look into")
    return code


def _run_in(args: argparse.Namespace, seed: int, chosen: list[str], root: Path | None) -> int:
    try:
        if args.url:
            target = resolve_target(args.url, args.token, args.token_file)
            deployment = Deployment(target.url, target.token, args.restart_cmd, args.restart_seconds)
            report = _run(args, seed, chosen, deployment, {})
        else:
            assert root is not None
            with (
                _state(root, args.small_disk) as (state, disk),
                Local(state, args, root / "supervisor.log") as local,
            ):
                menu = {**MID_RUN, **({"disk": faults.fill_disk(disk)} if disk is not None else {})}
                report = _run(args, seed, chosen, local, {name: menu[name] for name in chosen if name in RATES})
    except (DiskUnavailable, testing.StartError, OperatorError) as exc:
        print(f"crew-supervisor chaos: {exc}")
        return 2
    _print(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 1 if report["violations"] else 0


def _why_not(fault: str, target: Local | Deployment) -> str:
    if isinstance(target, Deployment):
        return "a deployment at --url: only the supervisor fault runs"
    if fault == "disk":
        return "not chosen: it needs --small-disk MB, a tmpfs that only root can mount"
    return "not chosen (--faults)"


@contextlib.contextmanager
def _state(root: Path, small_disk: int) -> Iterator[tuple[Path, SmallDisk | None]]:
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not small_disk:
        yield root / "state", None
        return
    with SmallDisk.mount(root / "disk", small_disk) as disk:
        yield disk.path / "state", disk


def _run(
    args: argparse.Namespace, seed: int, chosen: list[str], target: Local | Deployment, mid_run: dict[str, Fault]
) -> dict[str, Any]:
    rng = random.Random(seed)
    crews = crews_of(args)
    record, findings = Record(), Findings()
    acked: dict[str, dict[str, Any]] = {}
    requests: dict[str, int] = {}
    began = time.monotonic()
    console = Console(stderr=True)
    where = target.url if isinstance(target, Deployment) else f"state {target.state}"
    console.print(f"chaos: seed {seed}, {args.iterations} iterations, faults {', '.join(chosen)}, {where}")
    with target.client(timeout=30) as client:  # a deployment may not serve the effects crew: its jobs are left out
        if crews.effects not in client.get("/health").json()["crews"]:
            crews = dataclasses.replace(crews, effects="")
        # Each crew once unharmed, before any fault: what it does when it ends is counted whatever the load lets end.
        bodies = baseline_bodies(crews)
        requests["baseline starts"] = len(bodies)
        findings.add(run_baseline(client, bodies, acked))
    with Progress(
        TextColumn("[bold]chaos"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[jobs]} jobs, {task.fields[violations]} violations"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        task = progress.add_task("chaos", total=args.iterations, jobs=0, violations=0)
        for _ in range(args.iterations):
            if not _iteration(args, rng, chosen, target, mid_run, crews, record, findings, acked, requests):
                break
            progress.update(task, advance=1, jobs=len(acked), violations=len(findings.violations))
            if not console.is_terminal:  # no bar in a log: a line per iteration instead
                done = int(progress.tasks[0].completed)
                console.print(f"iteration {done}: {len(acked)} jobs, {len(findings.violations)} violations")
        else:
            with target.client(timeout=30) as client:
                check_restart(client, acked, [], _journal(target), record, findings, everything=True)
    return {
        "seed": seed,
        "target": where,
        "iterations": int(progress.tasks[0].completed),
        "faults": chosen,
        # Said, not left out silently: what a reader of this report must not assume was exercised.
        "faults_not_run": {name: _why_not(name, target) for name in ALL_FAULTS if name not in chosen},
        "concurrency": args.concurrency,
        "duration_seconds": round(time.monotonic() - began, 1),
        "confirmed": {name: record.counts.get(name, 0) for name in chosen},
        "requests": requests,
        "jobs_admitted": len(acked),
        "jobs_interrupted": len(findings.interrupted),
        "jobs_resumed": sum(1 for new in findings.resumed.values() if new),
        "orphans_found_at_restart": len(findings.orphans),
        "jobs_failed_by_their_crew": len(findings.crews_own),  # the crew's outcome, not a violation
        "jobs_that_left_processes": len(findings.left_running),  # killed and named in their record
        "not_checked": [] if isinstance(target, Local) else list(OUT_OF_SIGHT),
        "violations": findings.violations,
    }


def _iteration(
    args: argparse.Namespace,
    rng: random.Random,
    chosen: list[str],
    target: Local | Deployment,
    mid_run: dict[str, Fault],
    crews: Crews,
    record: Record,
    findings: Findings,
    acked: dict[str, dict[str, Any]],
    requests: dict[str, int],
) -> bool:
    """Load with faults, a stop or a crash, a restart, the invariants checked; False: the run cannot go on."""
    # A local supervisor is SIGKILLed with requests in flight. Stopping it gracefully (no supervisor fault),
    # or a deployment's command that both kills and restarts it, waits for the load to stop: jobs admitted
    # after it would still run when the invariants are read.
    crash = isinstance(target, Local) and "supervisor" in chosen
    before: list[Seen] = []
    with Load(target, rng, args.concurrency, record, acked, findings.violations, crews) as load:
        _inject(target, rng, record, mid_run, load)
        if crash and isinstance(target, Local):
            before, problem = target.kill(record)
            findings.add([problem] if problem else [])
    for what, count in load.requests.items():
        requests[what] = requests.get(what, 0) + count
    if load.stuck:
        return False
    try:
        if isinstance(target, Local):
            before = before if crash else target.stop()
        target.restart()
    except (testing.StartError, RestartError) as exc:  # a restart refused is a finding too
        first, *tail = str(exc).splitlines() or [""]  # a start error ends with the log's tail: its last line says why
        why = next((line.strip() for line in reversed(tail) if line.strip()), "")
        findings.add([f"the supervisor did not restart: {first} {why}".rstrip()])
        return False
    if isinstance(target, Deployment):
        record.count("supervisor")  # confirmed: another instance answers
    with target.client(timeout=30) as client:
        check_restart(client, acked, before, _journal(target), record, findings)
        resume_interrupted(client, acked, crews, findings)
    return True


def _journal(target: Local | Deployment) -> Path | None:
    return target.journal if isinstance(target, Local) else None


def _schedule(rng: random.Random, mid_run: dict[str, Fault]) -> tuple[float, list[tuple[float, str, float]]]:
    """An iteration's length and its faults (when, which, the seed of its own choices), drawn from the
    run's seed alone: a seed repeats the same faults at the same moments, whatever the machine's timing."""
    length = rng.uniform(0.5, 2.5)
    ticks = [tick * TICK_SECONDS for tick in range(1, int(length / TICK_SECONDS) + 1)]
    return length, [(at, name, rng.random()) for at in ticks for name in mid_run if rng.random() < RATES[name]]


def _inject(
    target: Local | Deployment, rng: random.Random, record: Record, mid_run: dict[str, Fault], load: Load
) -> None:
    length, schedule = _schedule(rng, mid_run)
    began = time.monotonic()
    for at, name, seed in schedule:
        load.stopping.wait(max(0.0, began + at - time.monotonic()))  # a fault that ran long delays the next
        if isinstance(target, Local) and mid_run[name](target.server, random.Random(seed), record):
            record.count(name)
    load.stopping.wait(max(0.0, began + length - time.monotonic()))


def _print(report: dict[str, Any]) -> None:
    rows = [
        ("seed", report["seed"]),
        ("iterations", report["iterations"]),
        *((f"confirmed {name} faults", count) for name, count in report["confirmed"].items()),
        *report["requests"].items(),
        ("jobs admitted", report["jobs_admitted"]),
        ("jobs interrupted by a crash", report["jobs_interrupted"]),
        ("interrupted jobs resumed", report["jobs_resumed"]),
        ("orphans found at restart", report["orphans_found_at_restart"]),
        ("jobs failed by their crew", report["jobs_failed_by_their_crew"]),
        ("jobs that left processes (killed)", report["jobs_that_left_processes"]),
        ("invariant violations", len(report["violations"])),
        ("duration (s)", report["duration_seconds"]),
    ]
    print("\n".join(f"{name:<34}{value:>10}" for name, value in rows))
    for skipped in report["not_checked"]:
        print(f"not checked (out of sight): {skipped}")
    for fault, why in report["faults_not_run"].items():
        print(f"fault not run: {fault}: {why}")
    for violation in report["violations"][:50]:
        print(f"VIOLATION {violation}")
