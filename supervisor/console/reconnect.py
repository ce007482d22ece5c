"""How the CLI's followers (``run``, ``events --follow``) ride out a lost link: they reconnect for as long as a
restart takes, up to ``--wait``, and say so on stderr once, then every ``NOTICE_SECONDS``, never a line a try."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from supervisor.console.durations import spoken
from supervisor.escaping import visible

DEFAULT_WAIT_SECONDS = 300.0  # a restart on a loaded machine: its drain, the journal's opening, CrewAI's import
NOTICE_SECONDS = 10.0  # between two "still reconnecting" lines
PAUSE_SECONDS = (0.1, 2.0)  # between tries: the first, and the most (a supervisor back is seen within it)


class GaveUp(Exception):
    """The link stayed lost for the whole ``--wait``: said in one line."""


def _stderr(line: str) -> None:
    print(f"crew-supervisor: {line}", file=sys.stderr, flush=True)


class Reconnect:
    """One follower's outages. ``lost`` at each failed try (it returns the pause before the next, or raises
    ``GaveUp`` once ``wait`` seconds have passed since the link was lost), ``alive`` at each byte the stream gives
    (a heartbeat too: the link works again, and the next loss is a new outage)."""

    def __init__(
        self,
        url: str,
        wait: float,
        say: Callable[[str], None] = _stderr,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url, self.wait, self.say, self.clock = url, wait, say, clock
        self.lost_at: float | None = None
        self.tries = 0
        self.noticed_at = -NOTICE_SECONDS  # the last line said: a link that drops every second says one per 10 s
        self.told = False  # this outage was said, so its end is too

    def lost(self, reason: str, resume_after: int | None) -> float:
        now = self.clock()
        if self.lost_at is None:
            self.lost_at, self.tries, self.told = now, 0, False
        out_for = now - self.lost_at
        if out_for >= self.wait:
            raise GaveUp(
                f"gave up reconnecting to {self.url} after {spoken(out_for)} (--wait {spoken(self.wait)}):"
                f" {visible(reason)}"
            )
        if now - self.noticed_at >= NOTICE_SECONDS:
            where = "from the start" if resume_after is None else f"after event {resume_after}"
            head = "still reconnecting" if self.told else "lost the link; reconnecting"
            self.say(
                f"{head} to {self.url} ({visible(reason)}), {spoken(out_for)} of --wait {spoken(self.wait)};"
                f" it resumes {where}"
            )
            self.noticed_at, self.told = now, True
        self.tries += 1
        first, most = PAUSE_SECONDS
        return min(first * 2.0 ** (self.tries - 1), most, self.wait - out_for)

    def alive(self, resume_after: int | None) -> None:
        if self.lost_at is None:
            return
        if self.told:
            where = "from the start" if resume_after is None else f"after event {resume_after}"
            self.say(f"reconnected to {self.url} after {spoken(self.clock() - self.lost_at)}; resumed {where}")
        self.lost_at = None
