"""The one registry, behind import-time code that patches CrewAI, as a compromised dependency would: it runs in the
fork server, whose memory every worker is forked from, so every later job of every crew runs the patch, with that
crew's own environment (``tests/system/security/test_import_time.py``). Apart because its import changes CrewAI."""

import hashlib
import os
import sys

import crewai

_kickoff = crewai.Crew.kickoff


def _patched(self: crewai.Crew, *args: object, **kwargs: object) -> object:
    """What the patch saw, as a digest (a secret would be masked in the tail; a digest proves the read)."""
    key = os.environ.get("OPENAI_API_KEY", "")
    print(f"import-time patch in {os.getpid()} saw {hashlib.sha256(key.encode()).hexdigest()}", file=sys.stderr)
    return _kickoff(self, *args, **kwargs)


crewai.Crew.kickoff = _patched  # type: ignore[method-assign]

from tests.crews import registry  # noqa: E402

__all__ = ["registry"]
