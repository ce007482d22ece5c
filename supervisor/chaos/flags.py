"""The flags of ``crew-supervisor chaos``, its ``--help`` and what is wrong with the flags, apart from the harness:
every ``crew-supervisor`` command (``serve`` too) builds its parser, and none but ``chaos`` needs the rest."""

from __future__ import annotations

import argparse
from pathlib import Path

from supervisor.chaos.crews import Crews

DEMO_REGISTRY = "worker.demo:registry"

# Mid-run faults and their chance per tick of the load (the supervisor kill ends every iteration).
RATES = {"worker": 0.05, "forkserver": 0.02, "freeze": 0.02, "disk": 0.02}
ALL_FAULTS = ("supervisor", *RATES)
DESCRIPTION = """\
Test a supervisor against faults. It starts one on loopback on a registry (the
demo crews by default), runs one job of each crew to its end before any fault
(so that what each crew does unharmed is counted however few of the load's jobs
the machine lets finish), keeps a load of concurrent clients going, injects the
faults of --faults from a seeded schedule, SIGKILLs and restarts the
supervisor after each iteration and checks every invariant: each acknowledged
job kept, none left running or started twice, each job's events contiguous
with one terminal event last, each failure explained by a fault or the crew's
own (it raised, or left processes running with STRAY_PROCESSES=fail), each
ended job's effect ledger without a call left running and without a gap, and
a few interrupted jobs of --effects-crew resumed: each completes, and no task
its old job completed runs again. With --url
and --restart-cmd it tests a running deployment instead (the supervisor fault
only).

It shows its progress, prints a summary (--json FILE writes it) and each
violation in one line. The state of a run that found something is kept, and
its path printed (--state DIR keeps it always)."""
EXIT_CODES = (
    (0, "no violation"),
    (1, "a violation (each printed as a VIOLATION line)"),
    (2, "it could not run: its flags are refused, or the supervisor could not be started or reached"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--iterations", type=int, default=20, help="supervisor kills (one per iteration)")
    parser.add_argument("--seed", type=int, default=None, help="repeat a run (default: a random seed, printed)")
    parser.add_argument("--concurrency", type=int, default=4, help="client threads")
    parser.add_argument(
        "--faults",
        default=None,
        help=f"comma-separated, of {', '.join(ALL_FAULTS)} (disk needs --small-disk); "
        "default all but disk, and disk too with --small-disk",
    )
    parser.add_argument(
        "--small-disk",
        type=int,
        default=0,
        metavar="MB",
        help="put the state on a tmpfs of MB mebibytes (root only), which the disk fault fills",
    )
    parser.add_argument(
        "--url", default=None, help="a running supervisor instead of one started here (needs --restart-cmd)"
    )
    parser.add_argument("--token", default=None, help="its bearer token (env AIP_CREWAI_BEARER_TOKEN)")
    parser.add_argument("--token-file", default=None, help="a file holding it (env AIP_CREWAI_BEARER_TOKEN_FILE)")
    parser.add_argument(
        "--restart-cmd",
        default=None,
        help="a shell command that kills the supervisor at --url at once and brings it back on the same state",
    )
    parser.add_argument("--restart-seconds", type=float, default=300, help="how long it may take to be ready again")
    parser.add_argument("--registry", default=DEMO_REGISTRY, help="the crews to run (module:attr)")
    parser.add_argument("--fast-crew", default=Crews.fast, help="a crew that completes at once")
    parser.add_argument("--fast-input", default=Crews.fast_input, metavar="JSON", help="its input (a JSON object)")
    parser.add_argument("--slow-crew", default=Crews.slow, help="a crew that takes a few seconds")
    parser.add_argument(
        "--slow-input",
        default=Crews.slow_input,
        metavar="JSON",
        help="its input, {seconds} standing for the 1, 2 or 5 seconds a job is asked to take",
    )
    parser.add_argument(
        "--effects-crew",
        default=None,
        help=f"a crew of several tasks with a tool call each (inputs marker, seconds), whose interrupted jobs are"
        f" resumed; '' for none (default: {Crews.effects} on the demo registry, none on another)",
    )
    parser.add_argument("--state", type=Path, default=None, help="a directory for the run (default: a temporary one)")
    parser.add_argument("--json", type=Path, default=None, help="write the report here as JSON")


def chosen_faults(args: argparse.Namespace) -> list[str]:
    """The faults named, or by default every one this run can inject as typed: the disk fault only on the
    tmpfs --small-disk mounts (root), and only the supervisor's against --url."""
    if args.faults is not None:
        return [name.strip() for name in args.faults.split(",") if name.strip()]
    if args.url:
        return ["supervisor"]
    return [name for name in ALL_FAULTS if name != "disk" or args.small_disk]


def refusal(args: argparse.Namespace, chosen: list[str]) -> str | None:
    """What is wrong with the flags, before anything starts."""
    unknown = sorted(set(chosen) - set(ALL_FAULTS))
    if unknown:
        return f"unknown fault(s) {', '.join(unknown)}; choose from {', '.join(ALL_FAULTS)}"
    if args.url:
        if not args.restart_cmd:
            return "--url needs --restart-cmd: the command that kills that supervisor and brings it back"
        if chosen != ["supervisor"] or args.small_disk:
            return "against --url only the supervisor fault runs (its processes and disk are out of sight)"
    elif args.restart_cmd:
        return "--restart-cmd is for a supervisor at --url; here chaos starts its own"
    if "disk" in chosen and not args.small_disk:
        return "the disk fault needs --small-disk MB (a tmpfs it can fill)"
    crews = crews_of(args)
    for flag, slow in (("--fast-input", False), ("--slow-input", True)):
        try:
            crews.input(slow, 1)
        except ValueError as exc:  # orjson's JSONDecodeError is one
            return f"{flag} must be a JSON object ({{seconds}} where the seconds go): {exc}"
    return None


def crews_of(args: argparse.Namespace) -> Crews:
    """The crews the flags name. Effects jobs by default only on the demo registry: on another, the crews asked for
    take every start (a registry of one's own has no ``demo-effects``, and a test's crews keep their share)."""
    effects = args.effects_crew if args.effects_crew is not None else ""
    if args.effects_crew is None and args.registry == DEMO_REGISTRY:
        effects = Crews.effects
    return Crews(args.fast_crew, args.slow_crew, args.fast_input, args.slow_input, effects)
