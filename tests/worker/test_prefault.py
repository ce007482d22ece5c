"""Copying ahead the pages a job writes: the probe finds them, ``populate`` copies them into a forked child."""

from __future__ import annotations

import array
import ctypes
import os
import platform

import pytest

from worker import prefault, tether

PAGES = 64


def buffer_pages(buffer: bytearray) -> set[int]:
    """The whole pages ``buffer`` spans (its ends may share a page with other objects)."""
    start = ctypes.addressof((ctypes.c_char * len(buffer)).from_buffer(buffer))
    first = -(-start // prefault.PAGE) * prefault.PAGE
    return set(range(first, (start + len(buffer)) // prefault.PAGE * prefault.PAGE, prefault.PAGE))


def covered(runs: array.array) -> set[int]:
    pages: set[int] = set()
    for i in range(0, len(runs), 2):
        pages.update(range(runs[i], runs[i] + runs[i + 1], prefault.PAGE))
    return pages


def test_the_probe_reports_the_pages_its_kickoff_wrote() -> None:
    buffer = bytearray(b"\x01" * (PAGES + 2) * prefault.PAGE)  # present here, shared with the probe after fork

    def kickoff() -> None:
        for offset in range(0, len(buffer), prefault.PAGE):
            buffer[offset] = 2

    runs = prefault.probe(kickoff)
    assert buffer_pages(buffer) <= covered(runs)
    assert buffer[0] == 1  # written in the probe only


def test_a_failing_kickoff_teaches_nothing() -> None:
    def kickoff() -> None:
        raise RuntimeError("the probe's kickoff failed")

    assert len(prefault.probe(kickoff)) == 0


@pytest.mark.skipif(
    tuple(int(part) for part in platform.release().split(".")[:2]) < (5, 14), reason="MADV_POPULATE_WRITE: Linux 5.14+"
)
def test_populate_gives_a_forked_child_its_own_copy_before_it_writes() -> None:
    buffer = bytearray(b"\x01" * (PAGES + 2) * prefault.PAGE)
    pages = buffer_pages(buffer)
    runs = array.array("Q", [min(pages), len(pages) * prefault.PAGE])
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            before = covered(prefault._written(prefault._private_writable())) & pages
            prefault.populate(runs)
            after = covered(prefault._written(prefault._private_writable())) & pages
            os._exit(0 if not before and after == pages else 1)
        finally:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another uid")
def test_the_probe_reads_its_page_map_in_an_undumpable_process_of_another_uid() -> None:
    """As the fork server runs in the container: uid 10001, undumpable (its /proc files are then root's)."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            tether.set_dumpable(False)
            buffer = bytearray(b"\x01" * (PAGES + 2) * prefault.PAGE)

            def kickoff() -> None:
                for offset in range(0, len(buffer), prefault.PAGE):
                    buffer[offset] = 2

            os._exit(0 if buffer_pages(buffer) <= covered(prefault.probe(kickoff)) else 1)
        finally:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
