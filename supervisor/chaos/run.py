"""The chaos loop and its report. Each iteration keeps the load going for a random while, injecting the
mid-run faults at random moments, then SIGKILLs the supervisor, restarts it on the same state and checks
the invariants; a last pass checks every job once more."""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from supervisor import testing
from supervisor.chaos import faults
from supervisor.chaos.checks import Findings, check_restart
from supervisor.chaos.disk import DiskUnavailable, SmallDisk
from supervisor.chaos.faults import Record
from supervisor.chaos.load import Load
from supervisor.testing import Server

Fault = Callable[[Server, random.Random, Record], bool]
TICK_SECONDS = 0.1
# Mid-run faults and their chance per tick of the load (the supervisor kill ends every iteration).
RATES = {"worker": 0.05, "forkserver": 0.02, "freeze": 0.02, "disk": 0.02}
MID_RUN: dict[str, Fault] = {
    "worker": faults.kill_worker,
    "forkserver": faults.kill_forkserver,
    "freeze": faults.freeze,
}
ALL_FAULTS = ("supervisor", *RATES)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--iterations", type=int, default=20, help="supervisor kills (one per iteration)")
    parser.add_argument("--seed", type=int, default=None, help="repeat a run (default: a random seed, printed)")
    parser.add_argument("--concurrency", type=int, default=4, help="client threads")
    parser.add_argument(
        "--faults",
        default=",".join(ALL_FAULTS),
        help=f"comma-separated, of {', '.join(ALL_FAULTS)} (disk needs --small-disk); default all",
    )
    parser.add_argument(
        "--small-disk",
        type=int,
        default=0,
        metavar="MB",
        help="put the state on a tmpfs of MB mebibytes (root only), which the disk fault fills",
    )
    parser.add_argument("--registry", default="worker.demo:registry", help="the crews to run (module:attr)")
    parser.add_argument("--fast-crew", default="demo", help="a crew that completes at once")
    parser.add_argument("--slow-crew", default="demo-slow", help="a crew taking input {'seconds': n}")
    parser.add_argument("--state", type=Path, default=None, help="a directory for the run (default: a temporary one)")
    parser.add_argument("--json", type=Path, default=None, help="write the report here as JSON")


def run(args: argparse.Namespace) -> int:
    chosen = [name.strip() for name in args.faults.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(ALL_FAULTS))
    if unknown:
        print(f"crew-supervisor chaos: unknown fault(s) {', '.join(unknown)}; choose from {', '.join(ALL_FAULTS)}")
        return 2
    if "disk" in chosen and not args.small_disk:
        print("crew-supervisor chaos: the disk fault needs --small-disk MB (a tmpfs it can fill)")
        return 2
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    root = args.state or Path(tempfile.mkdtemp(prefix="crew-chaos-"))
    try:
        with _state(root, args.small_disk) as (state, disk):
            report = _run(args, seed, chosen, state, disk, root / "supervisor.log")
    except (DiskUnavailable, testing.StartError) as exc:
        print(f"crew-supervisor chaos: {exc}")
        return 2
    _print(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 1 if report["violations"] else 0


@contextlib.contextmanager
def _state(root: Path, small_disk: int) -> Iterator[tuple[Path, SmallDisk | None]]:
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not small_disk:
        yield root / "state", None
        return
    with SmallDisk.mount(root / "disk", small_disk) as disk:
        yield disk.path / "state", disk


def _run(
    args: argparse.Namespace, seed: int, chosen: list[str], state: Path, disk: SmallDisk | None, log: Path
) -> dict[str, Any]:
    rng = random.Random(seed)
    menu = {**MID_RUN, **({"disk": faults.fill_disk(disk)} if disk is not None else {})}
    mid_run = {name: menu[name] for name in chosen if name in RATES}
    record, findings = Record(), Findings()
    acked: dict[str, dict[str, Any]] = {}
    requests: dict[str, int] = {}
    began = time.monotonic()
    console = Console(stderr=True)
    console.print(f"chaos: seed {seed}, {args.iterations} iterations, faults {', '.join(chosen)}, state {state}")
    sup = _start(state, args, log)
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
            crews = (args.fast_crew, args.slow_crew)
            with Load(sup, rng, args.concurrency, record, acked, findings.violations, crews) as load:
                _inject(sup, rng, record, mid_run, load)
                before = [(p.pid, p.create_time()) for p in sup.processes()]
                if "supervisor" in chosen:
                    if faults.kill_supervisor(sup):
                        record.count("supervisor")
                else:
                    sup.stop()
            for what, count in load.requests.items():
                requests[what] = requests.get(what, 0) + count
            try:
                sup = _start(state, args, log)
            except testing.StartError as exc:  # a journal or fence the restart refused is a finding too
                findings.add([f"the supervisor did not restart: {str(exc).splitlines()[0]} (log: {log})"])
                break
            with sup.client(timeout=30) as client:
                check_restart(client, acked, before, state / "journal.db", record, findings)
            progress.update(task, advance=1, jobs=len(acked), violations=len(findings.violations))
            if not console.is_terminal:  # no bar in a log: a line per iteration instead
                done = int(progress.tasks[0].completed)
                console.print(f"iteration {done}: {len(acked)} jobs, {len(findings.violations)} violations")
        else:
            with sup, sup.client(timeout=30) as client:
                check_restart(client, acked, [], state / "journal.db", record, findings, everything=True)
    return {
        "seed": seed,
        "iterations": int(progress.tasks[0].completed),
        "faults": chosen,
        "concurrency": args.concurrency,
        "duration_seconds": round(time.monotonic() - began, 1),
        "confirmed": {name: record.counts.get(name, 0) for name in chosen},
        "requests": requests,
        "jobs_admitted": len(acked),
        "jobs_interrupted": len(findings.interrupted),
        "orphans_found_at_restart": len(findings.orphans),
        "violations": findings.violations,
    }


def _schedule(rng: random.Random, mid_run: dict[str, Fault]) -> tuple[float, list[tuple[float, str, float]]]:
    """An iteration's length and its faults (when, which, the seed of its own choices), drawn from the
    run's seed alone: a seed repeats the same faults at the same moments, whatever the machine's timing."""
    length = rng.uniform(0.5, 2.5)
    ticks = [tick * TICK_SECONDS for tick in range(1, int(length / TICK_SECONDS) + 1)]
    return length, [(at, name, rng.random()) for at in ticks for name in mid_run if rng.random() < RATES[name]]


def _inject(sup: Server, rng: random.Random, record: Record, mid_run: dict[str, Fault], load: Load) -> None:
    length, schedule = _schedule(rng, mid_run)
    began = time.monotonic()
    for at, name, seed in schedule:
        load.stop.wait(max(0.0, began + at - time.monotonic()))  # a fault that ran long delays the next
        if mid_run[name](sup, random.Random(seed), record):
            record.count(name)
    load.stop.wait(max(0.0, began + length - time.monotonic()))


def _start(state: Path, args: argparse.Namespace, log: Path) -> Server:
    """Every start (the first and each restart) appends to one log, off the small disk."""
    return testing.start(
        state,
        args.registry,
        args=["--log-level", "warning"],
        log=log,
        max_concurrency=args.concurrency,
        max_retained_runs=100000,
        min_free_disk_mb=1,
    )


def _print(report: dict[str, Any]) -> None:
    rows = [
        ("seed", report["seed"]),
        ("iterations", report["iterations"]),
        *((f"confirmed {name} faults", count) for name, count in report["confirmed"].items()),
        *report["requests"].items(),
        ("jobs admitted", report["jobs_admitted"]),
        ("jobs interrupted by a crash", report["jobs_interrupted"]),
        ("orphans found at restart", report["orphans_found_at_restart"]),
        ("invariant violations", len(report["violations"])),
        ("duration (s)", report["duration_seconds"]),
    ]
    print("\n".join(f"{name:<34}{value:>10}" for name, value in rows))
    for violation in report["violations"][:50]:
        print(f"VIOLATION {violation}")
