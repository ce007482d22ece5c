"""``crew-supervisor``: ``serve`` (serve.py), ``doctor`` (doctor/), the operator commands (``jobs``,
``show``, ``events``, ``cancel``, ``top``, ``run``, ``crews``; console/) and ``chaos`` (chaos/). Only ``serve`` imports
the server."""

from __future__ import annotations

import argparse
import sys
from types import ModuleType
from typing import Any

from supervisor.doctor import findings, names  # the standard library only: they run before protocol is imported

# The top-level --help: what the tool is, its commands, where its documentation is.
DESCRIPTION = """\
Run CrewAI crews as durable jobs behind an HTTP API, one worker process per
job, so that a cancel, a timeout or a memory limit really stops the work.

  serve    run the supervisor
  doctor   check a deployment before it serves
  jobs, show, output, events, cancel, top, run, crews, archive
           watch and control the jobs of a running supervisor
  chaos    inject faults under load and check every invariant
  backup   copy the journal while the supervisor serves

"crew-supervisor COMMAND --help" says more of each. The documentation is the
project's README.md and docs/ (docs/settings.md describes every setting)."""

SERVE = """\
Run the supervisor: serve the HTTP API on HOST:PORT, admit jobs in order and
run each in a worker process of its own, recorded in the journal (STATE_FILE).

Each setting below is a flag or its {prefix}* environment variable (the
flag wins); docs/settings.md describes them. The bearer token is never a flag:
give --bearer-token-file or {prefix}BEARER_TOKEN. "crew-supervisor
doctor", with the same settings, checks them all first."""

SERVE_EXIT = (
    (1, "a setting is wrong, the port is in use or the journal cannot be opened (said in one line)"),
    (130, "stopped by Ctrl-C (SIGINT), after the drain (DRAIN_SECONDS)"),
    (143, "stopped by SIGTERM, after the drain"),
)


def parser() -> argparse.ArgumentParser:
    """Every command's parser (tests/project/test_help.py reads each one's help)."""
    from supervisor import backup, config
    from supervisor.chaos import flags as chaos_flags
    from supervisor.console import commands as console
    from supervisor.doctor import report as doctor

    raw = argparse.RawDescriptionHelpFormatter  # the descriptions are laid out by hand
    top = argparse.ArgumentParser(prog="crew-supervisor", description=DESCRIPTION, formatter_class=raw)
    commands = top.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser(
        "serve",
        help="run the supervisor",
        description=SERVE.format(prefix=config.PREFIX),
        epilog=console.exit_status(*SERVE_EXIT),
        formatter_class=raw,
    )
    serve_parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"], help="the log's level"
    )
    doctor_parser = _command(commands, "doctor", "check a deployment before it serves", doctor)
    for parser_with_settings in (serve_parser, doctor_parser):
        parser_with_settings.add_argument(
            "--demo", action="store_true", help="the registry: the offline demo crews that come with crew-supervisor"
        )
        config.add_flags(parser_with_settings)
    console.add_commands(commands)
    _command(commands, "chaos", "inject faults under load and check every invariant", chaos_flags)
    _command(commands, "backup", "copy the journal while the supervisor serves", backup)
    return top


def _command(commands: Any, name: str, summary: str, module: ModuleType) -> argparse.ArgumentParser:
    """A command whose module holds its words: ``DESCRIPTION``, ``EXIT_CODES`` and ``add_arguments``."""
    from supervisor.console.commands import exit_status

    command: argparse.ArgumentParser = commands.add_parser(
        name,
        help=summary,
        description=module.DESCRIPTION,
        epilog=exit_status(*module.EXIT_CODES),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    module.add_arguments(command)
    return command


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if names.shadowed():  # someone else's protocol would fail the imports below with no word of why
        sys.exit(_refuse(argv))
    from supervisor import config, logs
    from supervisor.console import commands as console
    from supervisor.doctor import report as doctor
    from supervisor.settings_table import SPEC

    args = parser().parse_args(argv)
    if args.command == "chaos":
        from supervisor.chaos.loop import run  # here: the harness (rich, psutil, the test harness) is chaos's alone

        sys.exit(run(args))
    if args.command == "backup":
        from supervisor import backup

        sys.exit(backup.run(args))
    if args.command not in ("serve", "doctor"):
        sys.exit(console.run_command(args))
    flags = {name: getattr(args, name) for name in SPEC}
    if args.demo:
        flags["REGISTRY"] = flags["REGISTRY"] or config.DEMO_REGISTRY
    if args.command == "doctor":
        sys.exit(doctor.run_remote(args) if args.url else doctor.run(flags, args.json))
    try:
        settings = config.load(flags)
    except config.ConfigError as exc:
        sys.exit(f"crew-supervisor: {exc}")
    logs.configure(args.log_level, settings.log_format)
    from supervisor.serve import serve  # here, not at the top: the operator commands need none of it

    serve(settings, args.log_level)


def _refuse(argv: list[str]) -> str | int:
    """A shadowed package's finding: in the doctor's words and format (``--json`` too) for ``doctor``, else one
    line."""
    found = [finding for finding in names.check() if finding.status == findings.PROBLEM]
    if argv[:1] != ["doctor"]:
        return f"crew-supervisor: {found[0].detail}; fix: {found[0].fix}"
    json_flag = argparse.ArgumentParser(add_help=False)
    json_flag.add_argument("--json", action="store_true")
    print(findings.report(found, json_flag.parse_known_args(argv[1:])[0].json))
    return 1
