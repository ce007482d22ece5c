"""The disk fault's tmpfs: once the fault ends its space is back, or the run stops saying so, so that a restart never
finds the disk full and reports that as the supervisor's finding. Root only (it mounts a tmpfs), as CI runs."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.chaos import disk as disk_module
from supervisor.chaos.disk import FILLER, DiskUnavailable, SmallDisk
from tests.helpers.small_disk import mounted

MiB = 1 << 20
HOLD = "import sys, time; f = open(sys.argv[1], 'rb'); print('held', flush=True); time.sleep(float(sys.argv[2]))"


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[SmallDisk]:
    yield from mounted(tmp_path / "disk", 16)


def held(disk: SmallDisk, seconds: float) -> subprocess.Popen[str]:
    """Another process holding the filler open for ``seconds``: its space stays taken after the unlink until then."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(disk.path / FILLER), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    return holder


def test_emptying_returns_once_the_fillers_space_is_back(disk: SmallDisk) -> None:
    assert disk.fill() and disk.free_bytes < MiB
    holder = held(disk, 1.0)
    disk.empty()
    assert disk.free_bytes > 15 * MiB  # a restart now finds its disk as the run left it, not full
    assert holder.wait(10) == 0


def test_a_filler_whose_space_never_comes_back_stops_the_run(disk: SmallDisk, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(disk_module, "EMPTY_SECONDS", 0.2)
    assert disk.fill()
    holder = held(disk, 30.0)
    try:
        with pytest.raises(DiskUnavailable, match=r"were not free 0\.2 s after"):
            disk.empty()
    finally:
        holder.kill()
        holder.wait(10)
