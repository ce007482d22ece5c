"""A child forked beside (worker/beside.py) is its forker's parent's child, as a fork server's worker is the
supervisor's, and runs Python's own after-fork hooks, as a child of os.fork does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import ROOT
from worker import beside

FORKER = textwrap.dedent(
    """
    import json, os, random, sys, threading
    from worker import beside
    hooks = []
    os.register_at_fork(after_in_child=lambda: hooks.append("child"))
    seed = random.random()
    pid = beside.fork_beside()
    if pid == 0:
        thread = threading.Thread(target=lambda: None)
        thread.start()
        thread.join()  # threads work in the child: its interpreter was reinitialised
        said = {"parent": os.getppid(), "hooks": hooks, "native": threading.get_native_id(), "pid": os.getpid()}
        os.write(1, json.dumps(said).encode() + b"\\n")
        os._exit(7)
    print(json.dumps({"child": pid}), flush=True)
    """
)


@pytest.mark.skipif(not beside.supported(), reason="no clone number known on this machine")
def test_a_child_forked_beside_is_our_parents_to_reap() -> None:
    forker = subprocess.run(
        [sys.executable, "-c", FORKER], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    said = [json.loads(line) for line in forker.stdout.splitlines()]
    child = next(line["child"] for line in said if "child" in line)
    _, status = os.waitpid(child, 0)  # ours: the forker's parent
    assert os.waitstatus_to_exitcode(status) == 7
    inside = next(line for line in said if "pid" in line)
    assert inside["parent"] == os.getpid() and inside["pid"] == child == inside["native"]
    assert inside["hooks"] == ["child"]


def test_a_native_thread_makes_the_process_not_alone() -> None:
    """What the fork server asks before it forks beside: the kernel's count of its threads, which a native pool's
    are in as much as Python's."""
    probe = textwrap.dedent(
        """
        import threading, time
        from worker import beside
        alone = beside.alone()
        thread = threading.Thread(target=time.sleep, args=(2,), daemon=True)  # a kernel task, as a native thread is
        thread.start()
        print(alone, beside.alone())
        """
    )
    said = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    assert said.stdout.split() == ["True", "False"]
