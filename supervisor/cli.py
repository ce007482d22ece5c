"""``crew-supervisor``: ``serve`` (serve.py), ``doctor`` (doctor/), the operator commands (``jobs``,
``show``, ``events``, ``cancel``, ``top``, ``run``; console/) and ``chaos`` (chaos/). Only ``serve`` imports
the server."""

from __future__ import annotations

import argparse
import sys

from supervisor import chaos, config, logs
from supervisor.chaos import flags as chaos_flags
from supervisor.console import commands as console
from supervisor.doctor import run as doctor


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="crew-supervisor", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser("serve", help="run the supervisor")
    serve_parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    doctor_parser = commands.add_parser(
        "doctor", help="check a deployment before it serves", description=doctor.__doc__
    )
    doctor.add_arguments(doctor_parser)
    for parser_with_settings in (serve_parser, doctor_parser):
        parser_with_settings.add_argument(
            "--demo", action="store_true", help=f"the offline demo crews ({config.DEMO_REGISTRY})"
        )
        config.add_flags(parser_with_settings)
    console.add_commands(commands)
    chaos_parser = commands.add_parser(
        "chaos", help="inject faults under load and check every invariant", description=chaos.__doc__
    )
    chaos_flags.add_arguments(chaos_parser)
    args = parser.parse_args(argv)
    if args.command == "chaos":
        from supervisor.chaos.run import run  # here: the harness (rich, psutil, the test harness) is chaos's alone

        sys.exit(run(args))
    if args.command not in ("serve", "doctor"):
        sys.exit(console.run_command(args))
    flags = {name: getattr(args, name) for name in config.SPEC}
    if args.demo:
        flags["REGISTRY"] = flags["REGISTRY"] or config.DEMO_REGISTRY
    if args.command == "doctor":
        sys.exit(doctor.run(flags, args.json))
    try:
        settings = config.load(flags)
    except config.ConfigError as exc:
        sys.exit(f"crew-supervisor: {exc}")
    logs.configure(args.log_level, settings.log_format)
    from supervisor.serve import serve  # here, not at the top: the operator commands need none of it

    serve(settings, args.log_level)
