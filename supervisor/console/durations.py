"""Durations as the CLI reads them (``--wait 2m``) and writes them (``3m05s``): one place for both."""

from __future__ import annotations

import argparse
import re

UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
MAX_SECONDS = 7 * 86400  # a wait of more than a week is a typo, and a sleep that long overflows nothing but patience
MAX_AGE_SECONDS = 10 * 365 * 86400  # an age to archive past: the longest ARCHIVE_AFTER_SECONDS takes


def duration(text: str, longest: float = MAX_SECONDS) -> float:
    """``90``, ``90s``, ``2m``, ``1.5h``, ``1d`` in seconds, at most ``longest`` (argparse's ``type``: a bad one is
    a usage error)."""
    match = _DURATION.fullmatch(text.strip().lower())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is no duration: give seconds (90, 90s) or 2m, 1h, 1d")
    seconds = float(match.group(1)) * UNITS[match.group(2)]
    if seconds > longest:
        raise argparse.ArgumentTypeError(f"{text!r} is longer than {spoken(longest)}")
    return seconds


def age(text: str) -> int:
    """How long ago (``archive --older-than 7d``), in whole seconds, up to ten years."""
    return int(duration(text, MAX_AGE_SECONDS))


def spoken(seconds: float) -> str:
    """At most two units, widest first: ``0.4s``, ``42s``, ``3m05s``, ``2h03m``, ``3d04h``."""
    seconds = max(seconds, 0.0)
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    for unit, size, smaller, small_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1)):
        if whole >= size:
            return f"{whole // size}{unit}{whole % size // small_size:02d}{smaller}"
    return f"{whole}s"
