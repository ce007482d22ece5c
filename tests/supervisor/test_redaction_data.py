"""Secrets out of what a worker wrote as JSON (an event's data, an output): each string replaced, a dict's keys
included, the structure and the types kept; and the search of the encoded JSON that spares a chunk the walk."""

from __future__ import annotations

import orjson

from supervisor.redaction import REDACTED, mentions, redact_data

KEY = "sk-live-0123456789abcdef"
QUOTED = 'pa"ss\\word-1234'  # a crew file's value is taken as written: quotes and backslashes included


def test_every_string_is_redacted_keys_included_and_nothing_else_changes() -> None:
    data = {
        "raw": f"the key is {KEY}",
        KEY: {"nested": [f"again {KEY}", 12345678, 1.5, True, None, {"deeper": KEY}]},
        "token_usage": {"total_tokens": 5},
        "plain": "nothing to see",
    }
    assert redact_data(data, (KEY,)) is data  # in place
    assert data == {
        "raw": f"the key is {REDACTED}",
        REDACTED: {"nested": [f"again {REDACTED}", 12345678, 1.5, True, None, {"deeper": REDACTED}]},
        "token_usage": {"total_tokens": 5},
        "plain": "nothing to see",
    }
    assert list(data) == ["raw", REDACTED, "token_usage", "plain"]  # a renamed key keeps its place
    assert redact_data(f"x{KEY}", (KEY,)) == f"x{REDACTED}" and redact_data(7, (KEY,)) == 7


def test_json_nested_deeper_than_python_recurses_is_walked() -> None:
    deep: list[object] = [KEY]
    for _ in range(5000):
        deep = [deep]
    redact_data(deep, (KEY,))
    inner = deep
    while isinstance(inner[0], list):
        inner = inner[0]
    assert inner == [REDACTED]


def test_the_encoded_search_finds_a_secret_wherever_a_string_holds_it_escaped_or_not() -> None:
    for secret in (KEY, QUOTED, "clé-secrète-été", "tab\there-and-more"):
        for data in ({"content": f"a {secret} b"}, {f"k{secret}": 1}, [[{"x": secret}]]):
            encoded = orjson.dumps(data)
            assert mentions(encoded, (secret,)), (secret, encoded)
            assert secret.encode() not in orjson.dumps(redact_data(data, (secret,)))
    assert not mentions(orjson.dumps({"content": "nothing", "n": 12345678}), (KEY, QUOTED, "12345678x"))
