"""The last traceback in a worker's stderr: a crew's exception, which its worker writes there whole before it
fails the job with the reference's generic words (``worker/job.py``)."""

from __future__ import annotations

START = "Traceback (most recent call last):"
MAX_LINES = 300  # CrewAI's calls are deep: a crew's exception took 60 lines here


def last_traceback(stderr: str, max_lines: int = MAX_LINES) -> str | None:
    """From the start of the last traceback to the end of ``stderr``; None if there is none in its last
    ``max_lines`` lines."""
    lines = stderr.rstrip("\n").split("\n")
    starts = [at for at, line in enumerate(lines) if line.startswith(START)]
    if not starts or len(lines) - starts[-1] > max_lines:
        return None
    return "\n".join(lines[starts[-1] :])
