"""The worker's seccomp filter: its table and program, and, in a real process that installs it, what it refuses and
what still works (threads, fork, posix_spawn, subprocess, sqlite, numpy, its own limits, nice value, scheduling,
affinity and I/O priority)."""

from __future__ import annotations

import errno
import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from worker import seccomp

UNISTD = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")
BPF_MAXINSNS = 4096
CHILD = """
import json, os, sqlite3, subprocess, threading
import numpy
from tests.helpers import attacks
from worker import seccomp

sleeper = subprocess.Popen(["sleep", "60"])  # ours to trace, but for the filter (the test runs as root, too)
try:
    refused = seccomp.refuse_unneeded_calls()
    sentinel = attacks.attacks(sleeper.pid)["unshare"]  # harmless if it passes: else nothing more is tried
    found = {"refused": sorted(refused), "sentinel": sentinel}
    if sentinel == "EPERM":
        thread = threading.Thread(target=lambda: None)
        thread.start()
        thread.join()
        forked = os.fork()
        if forked == 0:
            os._exit(7)
        found |= {
            "attacks": attacks.attacks(sleeper.pid),
            "table": attacks.every_refused(),
            "i386": attacks.i386_getpid(),
            "before": attacks.observe(sleeper.pid),
            "others": attacks.reach_others(sleeper.pid),
            "after": attacks.observe(sleeper.pid),
            "itself": attacks.change_itself(),
            "odd": attacks.odd_arguments(sleeper.pid),
            "sysv": attacks.sysv(),
            "fork": os.waitstatus_to_exitcode(os.waitpid(forked, 0)[1]),
            "spawn": os.waitstatus_to_exitcode(os.waitpid(os.posix_spawn("/bin/true", ["true"], {}), 0)[1]),
            "subprocess": subprocess.run(["sh", "-c", "echo hi"], capture_output=True, text=True).stdout,
            "sqlite": sqlite3.connect(":memory:").execute("select 40 + 2").fetchone()[0],
            "numpy": float(numpy.arange(4).sum()),
        }
    print(json.dumps(found))
finally:
    sleeper.kill()
    sleeper.wait()
"""


def _instructions(program: bytes) -> list[tuple[int, int, int, int]]:
    return [struct.unpack("=HBBI", program[at : at + 8]) for at in range(0, len(program), 8)]


SYSV_IPC = {"shmget", "shmat", "shmdt", "shmctl", "msgget", "msgsnd", "msgrcv", "msgctl"}
SYSV_IPC |= {"semget", "semop", "semtimedop", "semctl"}
# Each call that changes another process, and what its arguments must say to be let through: the caller itself. The
# words' offsets in seccomp_data written out (arguments from 16, 8 bytes each, low word first), not by the module.
ITSELF = {
    "prlimit64": ((seccomp.Equals(16, 0),), (seccomp.Equals(32, 0), seccomp.Equals(36, 0))),  # pid 0, or no new limit
    "setpriority": ((seccomp.Equals(16, seccomp.PRIO_PROCESS), seccomp.Equals(24, 0)),),
    "sched_setaffinity": ((seccomp.Equals(16, 0),),),
    "sched_setscheduler": ((seccomp.Equals(16, 0),),),
    "sched_setparam": ((seccomp.Equals(16, 0),),),
    "sched_setattr": ((seccomp.Equals(16, 0),),),
    "ioprio_set": ((seccomp.Equals(16, seccomp.IOPRIO_WHO_PROCESS), seccomp.Equals(24, 0)),),
}


def test_every_refusal_has_a_number_an_errno_and_a_one_line_reason() -> None:
    numbers = [refusal.number for refusal in seccomp.REFUSED.values()]
    assert len(set(numbers)) == len(numbers)
    for name, refusal in seccomp.REFUSED.items():
        assert refusal.reason.strip() and "\n" not in refusal.reason, name
        # ENOSYS for clone3 (glibc falls back to clone on it) and SysV IPC (programs fall back to POSIX's): as a
        # kernel without them answers.
        assert refusal.error == (errno.ENOSYS if name in {"clone3", *SYSV_IPC} else errno.EPERM), name
    assert {"name_to_handle_at", "personality", "getpriority", "sched_getaffinity"}.isdisjoint(seccomp.REFUSED)
    assert set(seccomp.REFUSED) >= SYSV_IPC


def test_only_the_calls_on_the_caller_itself_and_clone_without_a_namespace_are_let_through() -> None:
    """Words as the kernel reads them: a pid_t or int argument's low word (its high one is ignored), a pointer's
    both (NULL: no new limit). Anything else of these calls is refused."""
    conditional = {name: refusal.unless for name, refusal in seccomp.REFUSED.items() if refusal.unless}
    assert conditional == {**ITSELF, "clone": ((seccomp.Without(16, seccomp.CLONE_NAMESPACES),),)}


def test_the_numbers_are_the_kernel_headers_x86_64_ones() -> None:
    if not UNISTD.exists():
        pytest.skip(f"no {UNISTD} to compare with")
    defined = dict(re.findall(r"#define __NR_(\w+) (\d+)", UNISTD.read_text()))
    known = {name: refusal.number for name, refusal in seccomp.REFUSED.items() if name in defined}
    assert known == {name: int(defined[name]) for name in known}
    assert set(seccomp.REFUSED) - set(known) <= {"open_tree_attr"}  # Linux 6.15, newer than some headers


@pytest.mark.parametrize("program", [seccomp.x86_64_filter(), seccomp.clone3_filter()], ids=["x86_64", "other"])
def test_every_jump_lands_on_an_instruction_and_the_program_ends_in_returns(program: bytes) -> None:
    instructions = _instructions(program)
    assert len(instructions) <= BPF_MAXINSNS
    for index, (code, when_true, when_false, _) in enumerate(instructions):
        if code in (seccomp.JUMP_IF_EQUAL, seccomp.JUMP_IF_ANY_BIT):
            assert index + 1 + max(when_true, when_false) < len(instructions), index
    assert instructions[-1][0] == seccomp.RETURN
    assert {code for code, *_ in instructions} <= {
        seccomp.LOAD,
        seccomp.JUMP_IF_EQUAL,
        seccomp.JUMP_IF_ANY_BIT,
        seccomp.RETURN,
    }


def test_a_jump_past_a_byte_is_refused_when_the_program_is_built() -> None:
    far = [(seccomp.JUMP_IF_EQUAL, seccomp.ERRNO | errno.EPERM, None, 1)]
    far += [(seccomp.JUMP_IF_EQUAL, seccomp.ALLOW, None, 2)] * (seccomp.MAX_JUMP + 1)
    with pytest.raises(ValueError, match="does not fit in a byte"):
        seccomp._assemble(far)


@pytest.mark.skipif(not seccomp.native_x86_64(), reason="the deny-list's numbers are x86_64's; elsewhere only clone3")
def test_a_process_with_the_filter_is_refused_each_call_and_keeps_what_python_needs() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(  # a session of its own: its process group is the sleeper's and its own alone
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120, start_new_session=True
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["refused"] == sorted(seccomp.REFUSED)
    assert found["sentinel"] == "EPERM", found
    expected = {name: "ENOSYS" if name == "clone3" else "EPERM" for name in found["attacks"]}
    assert found["attacks"] == expected
    assert found["table"] == {name: errno.errorcode[refusal.error] for name, refusal in seccomp.REFUSED.items()}
    assert found["i386"] in ("ENOSYS", "no i386"), found["i386"]  # never "ok": its numbers would pass unjudged
    assert found["others"] == {**dict.fromkeys(found["others"], "EPERM"), "prlimit_read": "ok"}
    assert found["after"] == found["before"]
    assert found["itself"] == {
        **dict.fromkeys(found["itself"], "ok"),
        "psutil_nice": "AccessDenied",
    }  # it names its pid
    assert found["odd"] == {
        "prlimit_pointer": "EPERM",  # not EFAULT: the pointer's high word is read too
        "prlimit_own_high_word": "ok",  # the kernel reads pid 0 there, and so does the filter
        "setpriority_user": "EPERM",
        "setpriority_own_group": "EPERM",
        "ioprio_set_user": "EPERM",
        "ioprio_set_own_group": "EPERM",
    }
    assert found["sysv"] == dict.fromkeys(("shmget", "msgget", "semget"), "ENOSYS")
    assert (found["fork"], found["spawn"], found["subprocess"]) == (7, 0, "hi\n")
    assert (found["sqlite"], found["numpy"]) == (42, 6.0)
