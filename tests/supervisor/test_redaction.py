"""Secrets out of a worker's tails: which values are secrets, and each replaced, even cut by a tail's ends."""

from __future__ import annotations

from supervisor.processes.pipes import Tail
from supervisor.redaction import REDACTED, holding, redact, secrets_in

KEY = "sk-live-0123456789abcdef"


def test_secrets_are_the_values_of_secret_looking_names_and_the_token() -> None:
    env = {
        "OPENAI_API_KEY": KEY,
        "GITHUB_TOKEN": "ghp_aaaaaaaaaaaa",
        "DB_PASSWORD": "correct horse",
        "signing_secret": "lowercase-too",
        "FLAG_KEY": "1",  # too short to be a secret: it would redact every "1"
        "PATH": "/usr/bin:/bin",
        "KEYRING": "not a secret by its name",
    }
    found = secrets_in(env, ["bearer-token-value", None])
    assert set(found) == {KEY, "ghp_aaaaaaaaaaaa", "correct horse", "lowercase-too", "bearer-token-value"}
    assert [len(value) for value in found] == sorted((len(value) for value in found), reverse=True)
    # What the worker is told, so that it never cuts one between two chunk events: names, never the token.
    assert holding(env, found) == ["DB_PASSWORD", "GITHUB_TOKEN", "OPENAI_API_KEY", "signing_secret"]


def test_each_secret_is_replaced_the_longest_first() -> None:
    secrets = secrets_in({"A_KEY": KEY, "B_KEY": KEY[:12]})
    text = f"using {KEY} and {KEY[:12]}\nerror: Incorrect API key provided: {KEY}\n"
    assert redact(text, secrets) == f"using {REDACTED} and {REDACTED}\nerror: Incorrect API key provided: {REDACTED}\n"


def test_a_secret_cut_by_either_end_of_a_tail_goes_too_but_only_where_a_cut_can_be() -> None:
    assert redact(KEY[5:] + " was refused", (KEY,), cut_start=True) == f"{REDACTED} was refused"
    assert redact("calling with " + KEY[:10], (KEY,), cut_end=True) == f"calling with {REDACTED}"
    # A stream's own beginning cuts nothing, nor does a whole message: text that only looks like a cut stays.
    assert redact(KEY[5:] + " was refused", (KEY,)) == KEY[5:] + " was refused"
    assert redact("1234abcd apples", ("password1234abcd",)) == "1234abcd apples"
    # Five characters are not enough to tell a secret's part from ordinary text.
    assert redact(KEY[-5:] + " ok", (KEY,), cut_start=True) == KEY[-5:] + " ok"
    assert redact("nothing here", (KEY,), cut_start=True, cut_end=True) == "nothing here"


def test_a_tail_knows_when_it_lost_its_beginning() -> None:
    tail = Tail(limit=16)
    tail.data_received(b"0123456789")
    assert not tail.truncated
    tail.data_received(b"abcdefghij")
    assert tail.truncated and tail.text() == "456789abcdefghij"
