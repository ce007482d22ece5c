"""``crew-supervisor``: ``serve`` (serve.py), the operator commands (``jobs``, ``show``, ``events``,
``cancel``, ``top``, ``run``; console/) and ``chaos`` (chaos/). Only ``serve`` imports the server."""

from __future__ import annotations

import argparse
import sys

from supervisor import config, logs
from supervisor.chaos import run as chaos_run
from supervisor.console import commands as console


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="crew-supervisor", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser("serve", help="run the supervisor")
    serve_parser.add_argument(
        "--demo", action="store_true", help=f"serve the offline demo crews ({config.DEMO_REGISTRY})"
    )
    serve_parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    config.add_flags(serve_parser)
    console.add_commands(commands)
    chaos_parser = commands.add_parser(
        "chaos", help="inject faults under load and check every invariant", description=chaos_run.__doc__
    )
    chaos_run.add_arguments(chaos_parser)
    args = parser.parse_args(argv)
    if args.command == "chaos":
        sys.exit(chaos_run.run(args))
    if args.command != "serve":
        sys.exit(console.run_command(args))
    flags = {name: getattr(args, name) for name in config.SPEC}
    if args.demo:
        flags["REGISTRY"] = flags["REGISTRY"] or config.DEMO_REGISTRY
    try:
        settings = config.load(flags)
    except config.ConfigError as exc:
        sys.exit(f"crew-supervisor: {exc}")
    logs.configure(args.log_level, settings.log_format)
    from supervisor.serve import serve  # here, not at the top: the operator commands need none of it

    serve(settings, args.log_level)
