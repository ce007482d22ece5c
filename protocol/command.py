"""How the supervisor launches a worker and how a worker says why it left on its own: ``python -m worker <mode>
--parent-pid PID --cwd DIR``, and its exit codes. Both sides read them here (``supervisor/processes/launcher.py``
builds the line, ``worker/__main__.py`` parses it; a job's outcome names the code it left with)."""

from __future__ import annotations

import enum
from collections.abc import Sequence

PARENT_PID = "--parent-pid"  # the supervisor's pid: the worker exits ORPHANED if it is no longer its parent
CWD = "--cwd"  # its working directory (a job's scratch directory)
CREW = "--crew"  # check: the one crew to build


class Mode(enum.StrEnum):
    """What a worker process is for."""

    JOB = "job"  # runs one job
    DESCRIBE = "describe"  # says the registry's crews and what their jobs need, then leaves
    CHECK = "check"  # builds every crew once (``crew-supervisor doctor``)
    FORKSERVER = "forkserver"  # imports CrewAI once and forks each job's worker


class ExitCode(enum.IntEnum):
    """Why a worker left on its own before its job's answer (the BSD sysexits range, clear of a crew's own codes)."""

    ORPHANED = 75  # its supervisor was gone: nobody would read its answer
    CONTROL_CLOSED = 76  # its control pipe closed: the supervisor let it go
    STOPPED = 77  # the supervisor said Stop
    PROTOCOL = 78  # the supervisor sent what the protocol does not allow


def command_line(interpreter: Sequence[str], mode: Mode, parent_pid: int, cwd: str, *more: str) -> list[str]:
    """The worker's command line: ``interpreter`` (``python -s -m worker``), its mode, its parent and place."""
    return [*interpreter, mode.value, PARENT_PID, str(parent_pid), CWD, cwd, *more]
