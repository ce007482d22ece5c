"""The bearer tokens and the role each gives: the contract's (``BEARER_TOKEN`` or ``BEARER_TOKEN_FILE``), the
observers' (``OBSERVER_TOKEN_FILE``) and the operators' (``OPERATOR_TOKEN_FILE``).

A token file holds one token a line (blank lines and the whitespace around a token are ignored), so that a new token
can be added before the old one is taken out: a rotation with no restart and no client refused. Each file is read
at start-up, where anything wrong with it refuses the start, and again when one changes (``Credentials.refresh``
looks at most once a ``POLL_SECONDS``, a stat each): then every file is read and the roles checked together, so
that a token moved from one file to another is judged by both files' new contents. A file that cannot be used (emptied,
removed, made readable by others) keeps its tokens last read; a token in two roles keeps every role's, and the files
are read again at each look until it is gone. Each complaint is logged once, never with a token.
"""

from __future__ import annotations

import hmac
import logging
import os
import shlex
import stat
import time
from collections.abc import Mapping

from protocol import SETTINGS_PREFIX as PREFIX
from supervisor.enums import Role

log = logging.getLogger("crew_supervisor")

MAX_TOKEN_BYTES = 16384  # the reference's bound on its one token
MAX_TOKENS_PER_FILE = 32
MAX_FILE_BYTES = 64 * 1024
POLL_SECONDS = 1.0  # a rewritten file is in use within this (and the request after it)
# The setting naming each role's file.
FILE_SETTINGS = {
    Role.CONTRACT: "BEARER_TOKEN_FILE",
    Role.OPERATOR: "OPERATOR_TOKEN_FILE",
    Role.OBSERVER: "OBSERVER_TOKEN_FILE",
}


class TokenFileError(ValueError):
    """One line naming the setting, the file and what is wrong (never a token); ``fix`` says how to mend it."""

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.fix = fix


def read_tokens(setting: str, path: str) -> tuple[str, ...]:
    """The tokens in ``path`` (in order, each once): a regular file, not a link, that only its owner may read."""
    name = f"{PREFIX}{setting}={path!r}"
    regular = f"point {PREFIX}{setting} at a regular file (not a link), mode 0600"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise TokenFileError(f"{name}: cannot open without following links: {exc.strerror}", regular) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise TokenFileError(f"{name}: not a regular file", regular)
        if info.st_mode & 0o077:
            mode = f"{info.st_mode & 0o777:04o}"
            raise TokenFileError(f"{name}: mode {mode} lets others read it; use 0600", f"chmod 600 {shlex.quote(path)}")
        data = os.read(fd, MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise TokenFileError(f"{name}: larger than {MAX_FILE_BYTES} bytes")
    try:
        lines = data.decode().splitlines()
    except UnicodeDecodeError:
        raise TokenFileError(f"{name}: not UTF-8") from None
    tokens = tuple(dict.fromkeys(line.strip() for line in lines if line.strip()))
    if not tokens:
        raise TokenFileError(f"{name}: holds no token", f"write one token a line in {shlex.quote(path)}")
    if len(tokens) > MAX_TOKENS_PER_FILE:
        raise TokenFileError(f"{name}: more than {MAX_TOKENS_PER_FILE} tokens")
    for number, token in enumerate(tokens, 1):
        if problem := token_problem(token):
            raise TokenFileError(f"{name}: token {number} {problem}")
    return tokens


def token_problem(token: str) -> str | None:
    """What makes ``token`` unusable in an Authorization header, or None."""
    if len(token.encode()) > MAX_TOKEN_BYTES or any(ord(c) < 0x21 or ord(c) == 0x7F for c in token):
        return f"must be at most {MAX_TOKEN_BYTES} bytes of visible characters"
    return None


def shared(tokens: Mapping[Role, tuple[str, ...]]) -> tuple[Role, Role] | None:
    """Two roles that hold the same token, or None: a token gives one role, or a reader could cancel."""
    seen: dict[str, Role] = {}
    for role, held in tokens.items():
        for token in held:
            if seen.setdefault(token, role) != role:
                return seen[token], role
    return None


def in_two_roles(pair: tuple[Role, Role]) -> str:
    return f"the same token gives two roles, {pair[0]} and {pair[1]}: each role needs tokens of its own"


def _signature(path: str) -> tuple[int, ...] | None:
    """What changes when a file is rewritten or replaced (a rename over it: another inode)."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_mode


class Credentials:
    """Every token with its role, and the files they come from, read again when they change."""

    def __init__(self, tokens: Mapping[Role, tuple[str, ...]], files: Mapping[Role, str]) -> None:
        self.tokens = dict(tokens)
        self.files = dict(files)
        self._seen: dict[Role, tuple[int, ...] | None] = dict.fromkeys(self.files)  # read again at the first look
        self._warned: dict[Role, str] = {}
        self._clash: str | None = None  # the roles two files give one token, while they do: read again each look
        self._checked = time.monotonic()
        self._expected = self._headers()

    def role_of(self, header: bytes) -> Role | None:
        """The role of the token in ``header`` (the whole Authorization header), or None. Compared with every
        token, in constant time each and without stopping at a match: the time taken says nothing of which."""
        self.refresh()
        found = None
        for expected, role in self._expected:
            if hmac.compare_digest(header, expected):
                found = role
        return found

    def every_token(self) -> frozenset[str]:
        """Every role's tokens now: what a job's environment must not hold, and its output never shows."""
        self.refresh()
        return frozenset(token for held in self.tokens.values() for token in held)

    def refresh(self) -> None:
        """At most once a POLL_SECONDS: when a file changed (or two clashed at the last look), read them all."""
        now = time.monotonic()
        if now - self._checked < POLL_SECONDS:
            return
        self._checked = now
        signatures = {role: _signature(path) for role, path in self.files.items()}
        if signatures != self._seen or self._clash is not None:
            self._seen = signatures
            self._reload()

    def _reload(self) -> None:
        """Every file read, checked against the others as they are now, and all used at once: one rewritten
        before another (a token moved between roles) is never judged by the other's old tokens. A file that
        cannot be used keeps its tokens read before; a token in two roles keeps every role's."""
        read = dict(self.tokens)
        for role, path in self.files.items():
            try:
                read[role] = read_tokens(FILE_SETTINGS[role], path)
            except TokenFileError as exc:
                if self._warned.get(role) != str(exc):  # once, until the file changes its complaint or is mended
                    self._warned[role] = str(exc)
                    log.warning("%s; the %s tokens read before are kept", exc, role)
                continue
            self._warned.pop(role, None)
        if pair := shared(read):
            if self._clash != (clash := in_two_roles(pair)):
                log.warning("%s; the tokens read before are kept", clash)
            self._clash = clash
            return
        self._clash = None
        changed = [role for role in self.files if read[role] != self.tokens.get(role)]
        self.tokens = read
        self._expected = self._headers() if changed else self._expected
        for role in changed:  # a touch, or the first look since start-up, changes nothing
            log.info("%s%s read again: %d %s token(s)", PREFIX, FILE_SETTINGS[role], len(read[role]), role)

    def _headers(self) -> list[tuple[bytes, Role]]:
        return [(f"Bearer {token}".encode(), role) for role, held in self.tokens.items() for token in held]
