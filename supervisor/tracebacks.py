"""The last traceback in a worker's stderr: a crew's exception, which its worker writes there whole before it
fails the job with the reference's generic words (``worker/job.py``)."""

from __future__ import annotations

START = "Traceback (most recent call last):"
# The lines Python writes between the tracebacks of one chain (``raise ... from``, an exception while handling one).
CHAINED = (
    "The above exception was the direct cause of the following exception:",
    "During handling of the above exception, another exception occurred:",
)
MAX_LINES = 300  # CrewAI's calls are deep: a crew's exception took 60 lines here


def last_traceback(stderr: str, max_lines: int = MAX_LINES, max_chars: int | None = None) -> str | None:
    """From the start of the last traceback (with the ones chained before it, its causes) to the end of
    ``stderr``; None if there is none in its last ``max_lines`` lines. A chain longer than that, or than
    ``max_chars``, keeps its last tracebacks (each whole, from its first line)."""
    lines = stderr.rstrip("\n").split("\n")
    starts = [at for at, line in enumerate(lines) if line.startswith(START)]
    if not starts or len(lines) - starts[-1] > max_lines:
        return None
    first = starts.pop()
    while starts and _chained(lines[starts[-1] : first]) and _fits(lines[starts[-1] :], max_lines, max_chars):
        first = starts.pop()
    return "\n".join(lines[first:])


def _fits(lines: list[str], max_lines: int, max_chars: int | None) -> bool:
    return len(lines) <= max_lines and (max_chars is None or sum(map(len, lines)) + len(lines) - 1 <= max_chars)


def _chained(earlier: list[str]) -> bool:
    """Whether ``earlier`` (a traceback up to the next one) ends with the words that chain it to the next."""
    said = [line for line in earlier if line.strip()]
    return bool(said) and said[-1].strip() in CHAINED
