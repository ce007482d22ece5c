"""What scripts/load and scripts/soak share: one supervisor for the run, and a census of its process."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import psutil
from bench_harness import MiB, start_supervisor, wait_ready

from supervisor.testing import Server


@contextlib.contextmanager
def serving(prefix: str, settings: dict[str, str] | None = None, keep: bool = False) -> Iterator[Server]:
    """One ready fork-server supervisor (bench registry) in a temporary directory; stopped and removed after."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    (root / "markers").mkdir()
    sup = start_supervisor("sup", root, "forkserver", root / "markers", settings)
    try:
        wait_ready([sup])
        yield sup
    finally:
        sup.stop()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


@dataclasses.dataclass(frozen=True)
class Census:
    """What a leak would make grow. ``children`` counts live descendants (fork server, workers), zombies apart."""

    fds: int
    threads: int
    children: int
    zombies: int
    rss_mb: float


def census(pid: int) -> Census:
    me = psutil.Process(pid)
    statuses = []
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):  # a worker may exit while we look
            statuses.append(child.status())
    zombies = statuses.count(psutil.STATUS_ZOMBIE)
    return Census(me.num_fds(), me.num_threads(), len(statuses) - zombies, zombies, me.memory_info().rss / MiB)


class PeakRss:
    """Samples a process's RSS on a thread (every ``interval`` s) while in the ``with`` block; ``peak_mb`` after."""

    def __init__(self, pid: int, interval: float = 0.02) -> None:
        self.process = psutil.Process(pid)
        self.interval = interval
        self.peak_mb = 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.is_set():
            with contextlib.suppress(psutil.Error):
                self.peak_mb = max(self.peak_mb, self.process.memory_info().rss / MiB)
            self._done.wait(self.interval)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()


def verdict(name: str, violations: list[str], shown: int | None = None) -> list[str]:
    """A report's last lines: the violations (the first ``shown`` of them), then OK or how many there were."""
    ending = f"{name}: OK" if not violations else f"{name}: {len(violations)} violation(s)"
    return [f"  VIOLATION {v}" for v in violations[:shown]] + [ending]


PlanT = TypeVar("PlanT")


def parse_plan(plan_type: type[PlanT], doc: str | None) -> tuple[PlanT, argparse.ArgumentParser, bool]:
    """A flag per field of the plan dataclass (its default and type), plus ``--keep``: (plan, parser, keep)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    fields = dataclasses.fields(plan_type)  # type: ignore[arg-type]
    defaults: Any = plan_type()
    for field in fields:
        default = getattr(defaults, field.name)
        parser.add_argument(f"--{field.name.replace('_', '-')}", dest=field.name, type=type(default), default=default)
    parser.add_argument("--keep", action="store_true", help="keep the temporary state directory")
    args = parser.parse_args()
    return plan_type(**{field.name: getattr(args, field.name) for field in fields}), parser, args.keep
