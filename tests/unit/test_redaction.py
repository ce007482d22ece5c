"""Secrets out of a worker's tails: which values are secrets, and each replaced, even cut at the tail's start."""

from __future__ import annotations

from supervisor.redaction import REDACTED, redact, secrets_in

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


def test_each_secret_is_replaced_the_longest_first() -> None:
    secrets = secrets_in({"A_KEY": KEY, "B_KEY": KEY[:12]})
    text = f"using {KEY} and {KEY[:12]}\nerror: Incorrect API key provided: {KEY}\n"
    assert redact(text, secrets) == f"using {REDACTED} and {REDACTED}\nerror: Incorrect API key provided: {REDACTED}\n"


def test_a_tail_that_begins_inside_a_secret_loses_that_end_too() -> None:
    assert redact(KEY[5:] + " was refused", (KEY,)) == f"{REDACTED} was refused"
    # Three characters are not enough to tell a secret's end from ordinary text.
    assert redact(KEY[-3:] + " ok", (KEY,)) == KEY[-3:] + " ok"
    assert redact("nothing here", (KEY,)) == "nothing here"
