"""The pages of docs/ that are made from the code, so that each has one source (tests/project/test_docs_settings.py).

usage: scripts/docs.py settings   # write docs/settings.md from the settings table, supervisor/config.py's SPEC
"""

from __future__ import annotations

import argparse
import html
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from supervisor import config, settings_table

ROOT = Path(__file__).resolve().parent.parent
SETTINGS_PAGE = ROOT / "docs" / "settings.md"
REFRESH = ".venv/bin/python scripts/docs.py settings"
UNITS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20))
# A word with an underscore is a name (a setting, an operation, a reason), and so is a placeholder: {trace_id}.
NAME = re.compile(r"(\{\w+\}|\w*_\w*\*?)")
MARKDOWN = re.compile(r"([\\`*_|\[\]])")  # what would turn the rest of a help text into markup


def plain(text: str) -> str:
    """A help text as Markdown showing it as written, its names as code."""
    pieces = NAME.split(text)  # the names at odd indices
    return "".join(
        f"`{piece}`" if i % 2 else MARKDOWN.sub(r"\\\1", html.escape(piece, quote=False))
        for i, piece in enumerate(pieces)
    )


def values(name: str, parser: settings_table.Parser) -> str:
    """The Range / values cell."""
    if parser.bounds:
        return "–".join(f"{bound}{size(name, str(bound))}" for bound in parser.bounds)
    choices = ", ".join(f"`{choice}`" for choice in parser.choices)
    return " ".join(part for part in (plain(parser.accepts), choices) if part) or "—"


def size(name: str, value: str) -> str:
    """After a number of bytes, the same in the largest binary unit it is a whole number of; else nothing."""
    if name.endswith("_BYTES") and int(value):
        for unit, whole in UNITS:
            if int(value) % whole == 0:
                return f" ({int(value) // whole} {unit})"
    return ""


def settings_page(spec: Mapping[str, settings_table.Setting] = config.SPEC) -> str:
    example = "MAX_CONCURRENCY"
    not_flags = " ".join(
        f"`{name}` is not a flag, since {config.NOT_A_FLAG_BECAUSE}: use {plain(instead)}."
        for name, instead in config.NOT_FLAGS.items()
    )
    lines = [
        "---",
        "hide: [toc]  # the table needs the width; its rows are the page's only sections",
        "---",
        "",
        "# Settings",
        "",
        f"Every setting is an environment variable with the `{config.PREFIX}` prefix, or the flag of the same name"
        f" on `crew-supervisor serve` and `crew-supervisor doctor`: `{config.PREFIX}{example}=8` or"
        f" `{config.flag(example)} 8`. Flags win over the environment, and the environment over the defaults."
        f" {not_flags}",
        "",
        f"This page is generated from `supervisor/config.py` by `scripts/docs.py settings` (`{REFRESH}`).",
        "",
        "| Setting | Default | Range / values | Meaning |",
        "|---|---|---|---|",
    ]
    for name, setting in spec.items():
        default = f"`{setting.default}`{size(name, setting.default)}" if setting.default else "—"
        meaning = plain(setting.help) + (f"; {setting.doc}" if setting.doc else "")
        lines.append(f"| `{name}` | {default} | {values(name, setting.parse)} | {meaning} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="scripts/docs.py", description="write the docs/ pages made from the code")
    pages = parser.add_subparsers(dest="page", required=True)
    pages.add_parser("settings", help="docs/settings.md, from supervisor/config.py")
    parser.parse_args(argv)
    SETTINGS_PAGE.write_text(settings_page())
    print(f"wrote {SETTINGS_PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
