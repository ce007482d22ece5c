"""Token files as start-up reads them: several tokens a file, each role's own, and every bad file refused in one line
that names the setting and never a token; and read again together, as ``Credentials`` does when one changes.
(Rotation on a running server: tests/system/security/test_token_roles.py.)
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from supervisor import tokens
from supervisor.config import ConfigError, load
from supervisor.enums import Role
from supervisor.tokens import MAX_TOKENS_PER_FILE, Credentials, read_tokens
from tests.system.security.test_token_roles import write_tokens

BASE = {"AIP_CREWAI_REGISTRY": "m:r", "AIP_CREWAI_STATE_FILE": "/tmp/j.db"}


def token_file(path: Path, text: str, mode: int = 0o600) -> str:
    path.write_text(text)
    path.chmod(mode)
    return str(path)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    return {
        "AIP_CREWAI_BEARER_TOKEN_FILE": token_file(tmp_path / "contract", "contract-one\n"),
        "AIP_CREWAI_OBSERVER_TOKEN_FILE": token_file(tmp_path / "observer", "\n  observer-one  \n\nobserver-two\n"),
        "AIP_CREWAI_OPERATOR_TOKEN_FILE": token_file(tmp_path / "operator", "operator-one"),
    }


def test_each_role_gets_the_tokens_of_its_file_one_a_line(files: dict[str, str]) -> None:
    settings = load({}, {**BASE, **files})
    assert settings.tokens == {
        Role.CONTRACT: ("contract-one",),
        Role.OBSERVER: ("observer-one", "observer-two"),  # blank lines and the spaces around a token are ignored
        Role.OPERATOR: ("operator-one",),
    }
    assert settings.token == "contract-one"
    assert settings.every_token == {"contract-one", "observer-one", "observer-two", "operator-one"}


def test_the_contract_token_may_come_from_the_environment_beside_scoped_files(files: dict[str, str]) -> None:
    env = {**BASE, **files, "AIP_CREWAI_BEARER_TOKEN_FILE": "", "AIP_CREWAI_BEARER_TOKEN": "inline-contract"}
    assert load({}, env).tokens[Role.CONTRACT] == ("inline-contract",)


def _refusal(env: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as refused:
        load({}, {**BASE, **env})
    message = str(refused.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("setting", ["BEARER_TOKEN_FILE", "OBSERVER_TOKEN_FILE", "OPERATOR_TOKEN_FILE"])
def test_every_token_file_is_checked_as_the_contract_s_is(files: dict[str, str], tmp_path: Path, setting: str) -> None:
    name = f"AIP_CREWAI_{setting}"
    path = Path(files[name])
    path.chmod(0o640)
    assert _refusal(files) == f"{name}={str(path)!r}: mode 0640 lets others read it; use 0600"
    path.chmod(0o600)
    link = tmp_path / "link"
    os.symlink(path, link)
    assert "cannot open without following links" in _refusal({**files, name: str(link)})
    assert "not a regular file" in _refusal({**files, name: str(tmp_path)})
    assert "holds no token" in _refusal({**files, name: token_file(tmp_path / "empty", "\n  \n")})
    many = "".join(f"t{number}\n" for number in range(MAX_TOKENS_PER_FILE + 1))
    assert f"more than {MAX_TOKENS_PER_FILE} tokens" in _refusal({**files, name: token_file(tmp_path / "many", many)})
    spaced = token_file(tmp_path / "spaced", "fine\nnot one token\n")
    assert f"{name}={spaced!r}: token 2 must be at most 16384 bytes" in _refusal({**files, name: spaced})
    assert "larger than 65536 bytes" in _refusal({**files, name: token_file(tmp_path / "big", "x\n" * 40000)})


def test_a_token_in_two_roles_is_refused_naming_neither_token(files: dict[str, str], tmp_path: Path) -> None:
    shared = token_file(tmp_path / "shared", "operator-one\n")
    message = _refusal({**files, "AIP_CREWAI_OBSERVER_TOKEN_FILE": shared})
    assert message == "the same token gives two roles, operator and observer: each role needs tokens of its own"
    inline = {**files, "AIP_CREWAI_BEARER_TOKEN_FILE": "", "AIP_CREWAI_BEARER_TOKEN": "observer-two"}
    assert "contract and observer" in _refusal(inline)


def test_scoped_tokens_need_the_contract_s_token(files: dict[str, str]) -> None:
    env = {**files, "AIP_CREWAI_BEARER_TOKEN_FILE": "", "AIP_CREWAI_ALLOW_UNAUTHENTICATED": "true"}
    assert _refusal(env) == (
        "AIP_CREWAI_OPERATOR_TOKEN_FILE and AIP_CREWAI_OBSERVER_TOKEN_FILE need the contract's token too"
        " (AIP_CREWAI_BEARER_TOKEN_FILE)"
    )


@pytest.fixture
def promoting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Credentials, dict[Role, Path]]:
    """Credentials as a server holds them, looking at the files at each request; alice is an observer."""
    monkeypatch.setattr(tokens, "POLL_SECONDS", 0.0)
    paths = {role: tmp_path / role for role in (Role.CONTRACT, Role.OPERATOR, Role.OBSERVER)}
    for role, held in ((Role.CONTRACT, ["contract"]), (Role.OPERATOR, ["operator"]), (Role.OBSERVER, ["o", "alice"])):
        write_tokens(paths[role], *held)
    files = {role: str(path) for role, path in paths.items()}
    credentials = Credentials({role: read_tokens("X", path) for role, path in files.items()}, files)
    assert credentials.role_of(b"Bearer alice") == Role.OBSERVER
    return credentials, paths


def test_a_token_moved_between_two_files_at_once_gives_its_new_role(
    promoting: tuple[Credentials, dict[Role, Path]],
) -> None:
    """Both files rewritten before the next look: each is judged by the other's new tokens, not its old ones."""
    credentials, paths = promoting
    write_tokens(paths[Role.OPERATOR], "operator", "alice")
    write_tokens(paths[Role.OBSERVER], "o")
    assert credentials.role_of(b"Bearer alice") == Role.OPERATOR
    assert credentials.every_token() == {"contract", "operator", "alice", "o"}


def test_a_token_in_two_files_for_a_while_keeps_the_old_roles_then_takes_the_new(
    promoting: tuple[Credentials, dict[Role, Path]], caplog: pytest.LogCaptureFixture
) -> None:
    """A look between the two rewrites finds alice in both files: the roles read before are kept, and the files
    read again at each look, until the second rewrite ends the clash."""
    credentials, paths = promoting
    write_tokens(paths[Role.OPERATOR], "operator", "alice")
    for _ in range(3):
        assert credentials.role_of(b"Bearer alice") == Role.OBSERVER
    assert caplog.text.count("the same token gives two roles, operator and observer") == 1  # said once
    write_tokens(paths[Role.OBSERVER], "o")
    assert credentials.role_of(b"Bearer alice") == Role.OPERATOR
    assert "alice" not in caplog.text
