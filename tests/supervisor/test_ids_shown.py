"""An id a person reads to pick a job: no look-alike passes for another, and what is shown reads back exactly."""

from __future__ import annotations

import unicodedata

import pytest

from supervisor.escaping import ident, typed_id

LOOK_ALIKES = {
    "t\u0456des": "t\\u0456des",  # a Cyrillic і
    "\uff54ides": "\\uff54ides",  # a fullwidth t
    "ti\u200bdes": "ti\\u200bdes",  # a zero-width space
    unicodedata.normalize("NFD", "caf\u00e9"): "cafe\\u0301",  # an é made of e and a combining accent
    "caf\u00e9": "caf\\u00e9",  # the composed one: shown otherwise
    "tides\U0001f30a": "tides\\U0001f30a",  # past the basic plane: eight digits, no ambiguity
    "a\\u0456": "a\\\\u0456",  # a backslash is written out too, so this is not taken for the Cyrillic one
    "tab\there": "tab\\x09here",
    "tides ": "tides\\x20",  # a trailing space
    "ti  des": "ti\\x20\\x20des",  # how many spaces: counted, not guessed
}


@pytest.mark.parametrize(("action_id", "shown"), list(LOOK_ALIKES.items()))
def test_a_look_alike_is_written_out_and_reads_back(action_id: str, shown: str) -> None:
    assert ident(action_id) == shown and shown.isascii()
    assert typed_id(shown) == action_id


def test_plain_ids_are_shown_as_they_are_and_every_look_alike_differs_from_them() -> None:
    for plain in ("tides", "act_run_001", "cli-0b3e", "a?b#c", "50%"):
        assert ident(plain) == plain == typed_id(plain)
    assert len({ident(action_id) for action_id in LOOK_ALIKES} | {"tides"}) == len(LOOK_ALIKES) + 1


def test_what_names_no_character_is_kept_as_typed() -> None:
    assert typed_id("a\\ud800b") == "a\\ud800b"  # a lone surrogate: no character, so no id holds it
    assert typed_id("a\\b") == "a\\b"  # not a written-out character: the backslash is part of the id
