"""``crew-supervisor doctor``: the checks in order (a problem in ``findings.BLOCKING`` stops those that need it),
their lines and the verdict. ``DESCRIPTION`` and ``EXIT_CODES`` are its ``--help``.

It changes nothing of the deployment: a cgroup made to see whether the kernel allows one is removed at once,
and the crews are built in a throw-away directory.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path

from supervisor import config
from supervisor.doctor import names
from supervisor.doctor.findings import PROBLEM, Finding, ok, problem, report

SETTINGS_FIX = f"change that setting: its flag or {config.PREFIX} variable (crew-supervisor serve --help lists each)"
DESCRIPTION = f"""\
Check a deployment without serving it: that this installation's packages are
not shadowed by others of the same names, the settings, the journal, token and
training files, the crews (each built once, as a job would build it) and the
fork server's warm-up, CrewAI's telemetry switches, the cgroups, the resource
limits and the free disk.

It takes the settings exactly as serve does (the same flags, --demo included,
and the same {config.PREFIX}* environment), so run it as the user, with the
flags and in the environment that serve. Each check prints one line, ok,
warning or problem (with its fix), then a verdict; --json prints the findings
as a list of {{check, status, detail, fix}}. It changes nothing of the
deployment."""
EXIT_CODES = ((0, "ready to serve, or with --url serving (warnings allowed)"), (1, "a problem"))
URL_HELP = (
    "check the supervisor that serves at URL through its API instead: its health, a job's sandbox, its"
    f" capacity and crews (env {config.PREFIX}URL is not read: give the URL)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the findings as a JSON list")
    parser.add_argument("--url", help=URL_HELP)
    parser.add_argument("--token", help=f"with --url: the bearer token (env {config.PREFIX}BEARER_TOKEN)")
    parser.add_argument("--token-file", help=f"with --url: the file holding it (env {config.PREFIX}BEARER_TOKEN_FILE)")


def run_remote(args: argparse.Namespace) -> int:
    """``--url``: the token is taken as the operator commands take it (``--bearer-token-file``, serve's own flag,
    counts as ``--token-file``)."""
    from supervisor.console.client import OperatorError, resolve_target
    from supervisor.doctor import remote

    try:
        target = resolve_target(args.url, args.token, args.token_file or args.BEARER_TOKEN_FILE)
    except OperatorError as exc:
        findings = [problem("api", str(exc), remote.REACH_FIX)]
    else:
        findings = remote.check(target)
    print(report(findings, args.json, serving=True))
    return 1 if any(finding.status == PROBLEM for finding in findings) else 0


def run(flags: Mapping[str, str | None], as_json: bool) -> int:
    findings = names.check()
    if all(finding.status != PROBLEM for finding in findings):  # else the rest would run someone else's code
        findings += _deployment(flags)
    print(report(findings, as_json))
    return 1 if any(finding.status == PROBLEM for finding in findings) else 0


def _deployment(flags: Mapping[str, str | None]) -> list[Finding]:
    # Imported only now that the names are known to be ours: these modules load protocol and the rest.
    from supervisor.doctor import builds, files, host
    from supervisor.jobs.sandbox import check_places

    try:
        settings = config.load(flags)
        if settings.state_file:  # as serve checks them at start
            check_places(settings, Path(settings.state_file).absolute().parent)
    except config.ConfigError as exc:
        return [problem("settings", str(exc), exc.fix or SETTINGS_FIX), *builds.telemetry()]
    where = settings.state_file or "a temporary directory"
    found = [ok("settings", f"registry {settings.registry}, journal in {where}, on {settings.host}:{settings.port}")]
    found += files.state(settings) + files.token_and_training(settings)
    runtime = builds.runtime(settings)  # a worker that cannot start could only say "No module named ..."
    found += runtime if any(f.status == PROBLEM for f in runtime) else runtime + builds.built(settings)
    found += [*builds.telemetry(), host.tracing(os.environ)]
    return [
        *found,
        host.listen(settings),
        host.cgroups(settings),
        host.rlimits(settings),
        host.llm_budget(settings),
        files.disk(settings),
    ]
