"""``crew-supervisor run --input``: inline JSON, ``@FILE`` or ``FILE``, stdin, and ``{}`` when absent."""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import pytest

from supervisor.console import commands
from supervisor.console.client import OperatorError


def test_inline_json_a_file_either_way_and_stdin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "input.json").write_text('{"topic": "from a file"}')
    assert commands.read_input('{"topic": "inline"}') == {"topic": "inline"}
    assert commands.read_input(f"@{tmp_path / 'input.json'}") == {"topic": "from a file"}
    assert commands.read_input(str(tmp_path / "input.json")) == {"topic": "from a file"}  # as before
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b'{"topic": "piped"}')))
    assert commands.read_input("-") == {"topic": "piped"}


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("{topic: x}", "--input is not JSON"),
        ("@/nonexistent/input.json", "cannot read the input file /nonexistent/input.json: No such file"),
        ('{"a": 1} trailing', "--input is not JSON"),
    ],
)
def test_bad_input_says_which_and_why(given: str, said: str) -> None:
    with pytest.raises(OperatorError, match=said):
        commands.read_input(given)


def test_a_list_is_not_an_input(tmp_path: Path) -> None:
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(OperatorError, match=r"the input file .*list\.json must hold a JSON object"):
        commands.read_input(f"@{tmp_path / 'list.json'}")


def test_a_crew_that_takes_no_input_needs_no_flag() -> None:
    parser = argparse.ArgumentParser()
    commands.add_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["run", "demo"])
    assert commands.read_input(args.input) == {}


def test_json_that_is_no_object_is_refused_as_such_not_as_a_missing_file() -> None:
    for given in ("[1]", "null", "42"):
        with pytest.raises(OperatorError, match="--input must hold a JSON object"):
            commands.read_input(given)
