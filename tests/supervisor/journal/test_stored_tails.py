"""A worker's tails as the recorder stores them (``Streams.of``, then the journal's terminal commit), with a crew's
secrets whole and cut at every place of the stream and of the tail's bound: every record stored passes the journal's
own consistency check on its real file (a tail never has more characters than its stream had bytes), and no whole
secret, nor a secret's part of six characters or more at a cut edge, is left in it."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from supervisor.journal.records import Job, Streams
from supervisor.journal.statefiles import prepare_directory
from supervisor.journal.store import Journal
from supervisor.processes.pipes import Tail
from supervisor.redaction import MIN_FRAGMENT_CHARS, MIN_SECRET_CHARS, REDACTED, redact, secrets_in

# No character of the marker's: a secret found in a stored tail is then one that was left, never one that the
# marker and its neighbours happen to spell.
SECRET_CHARS = "ABCDEFGHJK0123456789-_"
FILLER = st.text(SECRET_CHARS + "xyz \n\u00e9\u4e2d", max_size=12)  # some characters of two and three bytes


@pytest.fixture
def stored(tmp_path: Path) -> Iterator[Stored]:
    state = tmp_path / "state"
    prepare_directory(state)
    opened = Journal(state / "journal.db", checkpoint_events=1)
    yield Stored(opened)
    opened.close()
    again = Journal(state / "journal.db", checkpoint_events=1)  # the next start's own check: nothing to quarantine
    assert again.quarantined == {}
    again.close()


class Stored:
    """Streams stored as jobs' stderr (and again as their stdout), committed as the recorder commits them."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.jobs = itertools.count()

    def store(self, cases: list[tuple[bytes, int]], secrets: tuple[str, ...]) -> list[tuple[Tail, str]]:
        """Each worker's tail (it wrote ``data`` into a tail of ``bound`` bytes) and its stderr as stored, once the
        journal's own check has found every record on the file consistent."""
        tails, written = [], []
        for data, bound in cases:
            tail = Tail(limit=bound)
            tail.data_received(data)
            action_id = f"job-{next(self.jobs)}"
            self.journal.admit(Job(action_id, "demo", "run", "hash", "running", 0))
            written.append(self.journal.finish(action_id, "completed", {}, streams=Streams.of(tail, tail, secrets)))
            tails.append((action_id, tail))
        for each in written:
            each.wait()
        assert not self.journal.reader.inconsistent()  # the very check a start makes
        found = []
        for action_id, tail in tails:
            stored = self.journal.reader.streams(action_id)
            assert stored is not None and stored.stdout == stored.stderr and stored.stderr_total == tail.total
            found.append((tail, stored.stderr))
        return found


def assert_redacted(tail: Tail, stored: str, secrets: tuple[str, ...]) -> None:
    text = tail.text()
    assert len(stored) <= len(text) <= tail.total
    whole = redact(text, secrets, cut_start=tail.truncated, cut_end=True)
    assert whole.endswith(stored)  # only its beginning was given up
    if len(whole) <= len(text):
        assert stored == whole  # and only when the markers did not fit
    begins = tail.truncated or stored != whole  # its beginning is a cut, not the stream's own
    # A marker is given up whole: a tail that gave up its beginning begins with a piece of one only if what the
    # worker wrote did (the tail's bound cut a look-alike).
    assert stored == whole or not in_marker(stored) or in_marker(text)
    for secret in secrets:
        assert secret not in stored
        for cut in range(MIN_FRAGMENT_CHARS, len(secret)):
            assert not stored.endswith(secret[:cut]), (secret, cut)
            assert not (begins and stored.startswith(secret[-cut:])), (secret, cut)


def in_marker(text: str) -> bool:
    """Whether ``text`` begins inside a marker."""
    return any(text.startswith(REDACTED[i:]) for i in range(1, len(REDACTED)))


def secret() -> st.SearchStrategy[str]:
    return st.text(SECRET_CHARS, min_size=MIN_SECRET_CHARS, max_size=24)


@st.composite
def streams(draw: st.DrawFn) -> tuple[bytes, int, tuple[str, ...]]:
    """Filler, whole secrets and parts of them (any beginning, end or middle), in any order; a tail bound that cuts
    anywhere, the whole stream included."""
    drawn = draw(st.lists(secret(), min_size=1, max_size=3, unique=True))
    part = st.tuples(st.sampled_from(drawn), st.integers(0, 24), st.integers(0, 24)).map(lambda s: s[0][s[1] : s[2]])
    pieces = draw(st.lists(st.one_of(FILLER, st.sampled_from(drawn), part), max_size=10))
    data = "".join(pieces).encode()
    return data, draw(st.integers(1, len(data) + 4)), secrets_in({}, drawn)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(streams())
# What brought the journal down: a key's first six characters ending the stream, a whole eight-character key.
@example((b"Incorrect API key provided: sk-acm", 4096, ("sk-acme-0123456789",)))
@example((b"ABCD1234", 4096, ("ABCD1234",)))
@example((b"ABCD1234" * 50, 64, ("ABCD1234",)))
def test_a_stored_tail_keeps_within_its_byte_count_and_keeps_no_secret(
    stored: Stored, case: tuple[bytes, int, tuple[str, ...]]
) -> None:
    data, bound, secrets = case
    [(tail, text)] = stored.store([(data, bound)], secrets)
    assert_redacted(tail, text, secrets)


def test_every_cut_of_a_stream_of_secrets_is_stored_consistent_and_masked(stored: Stored) -> None:
    """Exhaustively: every end a write can stop at, every bound a tail can cut its beginning at."""
    key, short = "sk-acme-0123456789", "ABCD1234"
    secrets = secrets_in({"OPENAI_API_KEY": key, "B_TOKEN": short})
    # Whole, a marker's look-alike, the end of one (left where no cut is), the beginning of one at the end.
    stream = f"{key}{short}|{REDACTED}{key[3:]}{short}{key[:9]}".encode()
    cases = [(stream[:end], bound) for end in range(1, len(stream) + 1) for bound in range(1, end + 1)]
    for tail, text in stored.store(cases, secrets):
        assert_redacted(tail, text, secrets)
