"""``crew-supervisor --help`` and each command's help are for its users: what it does, its exit codes, and the
flags the documentation names, with no module path or docstring markup of the code's."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from supervisor import backup, chaos, cli, config
from supervisor.chaos import flags as chaos_flags
from supervisor.console import commands
from supervisor.doctor import report as doctor

# Module paths and reST markup: what a developer docstring says and a user's help must not.
CODE_WORDS = re.compile(r"\w\.py\b|``|\b(supervisor|worker|protocol|console|doctor|chaos)/")
CONNECTING = {"--url", "--token", "--token-file", "--json"}
# The flags docs/ and the README name, by command.
DOCUMENTED = {
    "serve": {"--demo", "--log-level", *(config.flag(name) for name in config.SPEC)},
    "doctor": {"--demo", "--json", "--url", "--token", "--token-file", *(config.flag(name) for name in config.SPEC)},
    "jobs": CONNECTING | {"--status", "--crew", "--operation", "--limit", "--cursor"},
    "show": CONNECTING,
    "crews": CONNECTING,
    "output": CONNECTING | {"--stream"},
    "stack": CONNECTING,
    "effects": CONNECTING,
    "events": CONNECTING | {"--follow", "--wait"},
    "cancel": CONNECTING | {"--reason", "--crew", "--status", "--operation", "--all", "--dry-run"},
    "top": CONNECTING | {"--once", "--interval"},
    "archive": CONNECTING | {"--older-than", "--status", "--crew", "--dry-run", "--yes"},
    "resume": CONNECTING | {"--as", "--timeout-ms", "--idempotency-key", "--detach", "--wait"},
    "run": CONNECTING
    | {"--input", "--operation", "--action-id", "--timeout-ms", "--idempotency-key", "--detach", "--wait"},
    "chaos": {
        *("--iterations", "--seed", "--concurrency", "--faults", "--small-disk", "--url", "--token", "--token-file"),
        *("--restart-cmd", "--restart-seconds", "--registry", "--fast-crew", "--slow-crew", "--state", "--json"),
        *("--fast-input", "--slow-input", "--effects-crew"),
    },
    "backup": {"--force", "--state-file"},
}
DEVELOPER_DOCSTRINGS = [module.__doc__ for module in (cli, chaos, chaos_flags, commands, doctor, backup)]


def subcommands() -> dict[str, argparse.ArgumentParser]:
    (action,) = (a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_command_is_checked() -> None:
    assert set(subcommands()) == set(DOCUMENTED)


def test_the_top_level_help_says_what_the_tool_is_and_where_its_docs_are() -> None:
    text = cli.parser().format_help()
    assert "CrewAI" in text and "docs/" in text and "README" in text
    assert all(name in text for name in DOCUMENTED)
    assert not CODE_WORDS.search(text), CODE_WORDS.search(text)


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_a_commands_help_is_user_text(name: str) -> None:
    parser = subcommands()[name]
    assert parser.description and len(parser.description) > 40
    text = parser.format_help()
    assert not CODE_WORDS.search(text), CODE_WORDS.search(text)
    for docstring in DEVELOPER_DOCSTRINGS:
        assert docstring is not None and docstring.splitlines()[0] not in text


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_the_documented_flags_exist(name: str) -> None:
    options = {option for action in subcommands()[name]._actions for option in action.option_strings}
    assert DOCUMENTED[name] <= options, DOCUMENTED[name] - options


@pytest.mark.parametrize(
    ("name", "codes"),
    [
        ("jobs", {0, 1}),
        ("show", {0, 1}),
        ("crews", {0, 1}),
        ("output", {0, 1}),
        ("cancel", {0, 1}),
        ("archive", {0, 1}),
        ("top", {0, 1, 130}),
        ("events", {0, 1, 3, 4, 130, 141}),
        ("run", {0, 1, 3, 4, 130, 141}),
        ("resume", {0, 1, 3, 4, 130, 141}),
        ("doctor", {0, 1}),
        ("chaos", {0, 1, 2}),
        ("serve", {1, 130, 143}),
        ("backup", {0, 1}),
    ],
)
def test_the_exit_codes_are_listed(name: str, codes: set[int]) -> None:
    epilog = subcommands()[name].epilog or ""
    listed = {int(code) for code in re.findall(r"^  (\d+) ", epilog, re.M)}
    assert epilog.startswith("exit status:") and listed == codes


ROOT = Path(__file__).resolve().parents[2]
PROSE = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
# `crew-supervisor COMMAND ...` as the documentation writes it, up to where the command line ends.
USE = re.compile(r"crew-supervisor (\w+)([^`|;&#\n]*)")


def test_every_flag_the_documentation_uses_exists() -> None:
    """The docs and the help agree: each flag a page gives a command is one of that command's."""
    commands = subcommands()
    used = 0
    for page in PROSE:
        text = page.read_text().replace("\\\n", " ")
        for name, rest in USE.findall(text):
            if name not in commands:
                continue
            options = {option for action in commands[name]._actions for option in action.option_strings}
            unquoted = re.sub(r"'[^']*'|\"[^\"]*\"", "", rest)  # a quoted command (--restart-cmd '...') is not ours
            for flag in re.findall(r"(?<![\w-])--[a-z][a-z-]*", unquoted):
                used += 1
                assert flag in options, f"{page.name}: crew-supervisor {name} has no {flag}"
    assert used > 30  # the pages use the CLI: the scan sees them
