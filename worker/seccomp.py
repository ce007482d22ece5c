"""Seccomp: the system calls a worker process refuses itself, for good (its children inherit the filter).

``REFUSED`` is the table: each call's x86_64 number, the errno it gets, why a crew never needs it, and when it is
let through after all (``unless``: the arguments of its harmless uses; none: always refused). Four kinds:

- ``clone3``, whose ``CLONE_INTO_CGROUP`` starts a child in any cgroup v2 directory the process can open,
  read-only too: Landlock, which judges opening and changing files, cannot see it, so a job could start a process
  outside its own cgroup and every cap and kill on it. ENOSYS, as a kernel without it answers: glibc
  (``posix_spawn``, ``pthread_create``) then falls back to ``clone``, which has no such flag.
- The deny-list: calls that reach into other processes (other jobs' workers share our uid and are dumpable) or
  into the kernel's privileged surface (namespaces, mounts, modules, BPF, keyrings). EPERM, as the kernel answers
  a caller without the privilege, so a program that probes for them takes its usual fallback. ``clone`` with a
  namespace flag is refused with them, as ``unshare`` is: it is the other way to a new namespace.
- The calls that change another process's limits, nice value, scheduling, affinity or I/O priority: the kernel
  lets any process of a uid change every other of that uid without a capability, and the supervisor, the fork
  server and every job's worker may share one (the container's). A filter compares arguments with constants only,
  never with the caller's pid, so each is let through only for the caller itself as the C library and Python
  say it (pid 0: ``resource.setrlimit``, ``os.nice``, ``os.sched_setaffinity(0, …)``); an explicit pid, the
  caller's own included, gets EPERM. Reading another's limits (``prlimit64`` without a new one) stays allowed.
- SysV IPC: its segments, queues and semaphores outlive their job (and the supervisor), any job of the uid can
  reach them, and their memory is no job's. A namespace of its own per job would need a capability at the fork
  or a user namespace, both refused to jobs. ENOSYS, as a kernel built without SysV IPC answers, so a program
  takes its fallback (POSIX shared memory, which Landlock judges).

The filter first checks the ABI a call came by (``seccomp_data.arch``), since the numbers are x86_64's: an
x86_64 process can also call through ``int 0x80`` (i386, whose numbers differ) and with the x32 bit set (x32,
whose ``ptrace`` and ``process_vm_*`` have numbers of their own). Both get ENOSYS for every call, as a kernel
built without them answers; nothing a crew runs is i386 or x32. On another machine (aarch64) the table's
numbers would name other calls, so only ``clone3`` (435 on every architecture) is refused, and
``refuse_unneeded_calls`` says so by the names it returns.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from collections.abc import Mapping
from typing import NamedTuple, TypeAlias

from worker.landlock import PR_SET_NO_NEW_PRIVS

PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
AUDIT_ARCH_X86_64 = 0xC000003E
X32_BIT = 0x40000000  # x86_64's x32 ABI numbers its calls with this bit set
CLONE, CLONE3 = 56, 435  # clone3's number is the same on every architecture, its compat ABIs included
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET: no thread or posix_spawn clone sets one.
CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
# Classic BPF over struct seccomp_data: nr (u32 at 0), arch (u32 at 4), ip, then args (u64 each, from 16).
NR, ARCH = 0, 4
LOAD, JUMP_IF_EQUAL, JUMP_IF_ANY_BIT, RETURN = 0x20, 0x15, 0x45, 0x06
ALLOW, ERRNO = 0x7FFF0000, 0x00050000
MAX_JUMP = 255  # a conditional jump's offset is one byte
PRIO_PROCESS, IOPRIO_WHO_PROCESS = 0, 1  # setpriority's and ioprio_set's "which": one process (or thread)


def low(argument: int) -> int:
    """Where argument ``argument`` (from 0) of a call has its low 32 bits in seccomp_data (little-endian): all the
    kernel reads of an ``int`` or ``pid_t`` argument, whatever the caller put in the register's high word."""
    return 16 + 8 * argument


def high(argument: int) -> int:
    """Where its high 32 bits are: a pointer's other half."""
    return low(argument) + 4


class Equals(NamedTuple):
    """A word of the arguments (``low(n)`` or ``high(n)``) has this value."""

    word: int
    value: int


class Without(NamedTuple):
    """A word of the arguments has none of these bits."""

    word: int
    bits: int


Checks: TypeAlias = tuple[Equals | Without, ...]  # all must hold
SELF: Checks = (Equals(low(0), 0),)  # pid 0 as the first argument: the calling process or thread itself


class Refusal(NamedTuple):
    number: int  # x86_64's
    error: int
    reason: str
    unless: tuple[Checks, ...] = ()  # let through when all checks of one of these hold; none: always refused


def _deny(number: int, reason: str, unless: tuple[Checks, ...] = ()) -> Refusal:
    return Refusal(number, errno.EPERM, reason, unless)


def _nosys(number: int, reason: str) -> Refusal:
    return Refusal(number, errno.ENOSYS, reason)


REFUSED: dict[str, Refusal] = {
    "clone3": Refusal(CLONE3, errno.ENOSYS, "CLONE_INTO_CGROUP starts a child outside the job's cgroups"),
    "ptrace": _deny(101, "attaches to another job's worker: reads and writes its memory and registers"),
    "process_vm_readv": _deny(310, "reads another process's memory (another job's worker: its keys, inputs)"),
    "process_vm_writev": _deny(311, "writes another process's memory"),
    "pidfd_getfd": _deny(438, "copies a descriptor out of another process (its sockets, its journal)"),
    "process_madvise": _deny(440, "acts on another process's memory through a pidfd"),
    "kcmp": _deny(312, "compares another process's kernel objects: a probe of what it holds"),
    "bpf": _deny(321, "loads programs into the kernel: the largest attack surface a process can reach"),
    "perf_event_open": _deny(298, "profiles the kernel and other processes; a frequent exploit path"),
    "userfaultfd": _deny(323, "stalls the kernel inside a page fault: the classic way to win a kernel race"),
    "kexec_load": _deny(246, "replaces the running kernel"),
    "kexec_file_load": _deny(320, "replaces the running kernel"),
    "init_module": _deny(175, "loads a kernel module"),
    "finit_module": _deny(313, "loads a kernel module"),
    "delete_module": _deny(176, "unloads a kernel module"),
    "mount": _deny(165, "changes the mount table (in a new namespace, without privilege)"),
    "umount2": _deny(166, "changes the mount table"),
    "pivot_root": _deny(155, "changes the root file system"),
    "move_mount": _deny(429, "the new mount API: changes the mount table"),
    "open_tree": _deny(428, "the new mount API: clones a mount"),
    "open_tree_attr": _deny(467, "the new mount API: clones a mount with new attributes"),
    "fsopen": _deny(430, "the new mount API: a file system context"),
    "fsconfig": _deny(431, "the new mount API: configures a file system context"),
    "fsmount": _deny(432, "the new mount API: makes a mount"),
    "fspick": _deny(433, "the new mount API: reconfigures a mount"),
    "mount_setattr": _deny(442, "the new mount API: changes a mount's flags"),
    "unshare": _deny(272, "new namespaces: a user namespace opens root-only kernel code to the job"),
    "setns": _deny(308, "enters another process's namespaces"),
    "keyctl": _deny(250, "the kernel keyrings, shared by the uid's processes: other jobs' keys"),
    "add_key": _deny(248, "the kernel keyrings"),
    "request_key": _deny(249, "the kernel keyrings; may run a helper program"),
    "open_by_handle_at": _deny(304, "opens a file by handle, past the path's permissions (the shocker escape)"),
    "swapon": _deny(167, "changes the system's swap"),
    "swapoff": _deny(168, "changes the system's swap"),
    "reboot": _deny(169, "reboots or halts the machine"),
    "acct": _deny(163, "switches process accounting"),
    "quotactl": _deny(179, "changes disk quotas"),
    "quotactl_fd": _deny(443, "changes disk quotas"),
    "iopl": _deny(172, "raw I/O port access"),
    "ioperm": _deny(173, "raw I/O port access"),
    "lookup_dcookie": _deny(212, "a profiling interface, gone from recent kernels"),
    "clone": _deny(
        CLONE, "with a namespace flag: the other way to a new namespace", unless=((Without(low(0), CLONE_NAMESPACES),),)
    ),
    # Another process's limits, priority and scheduling: only the caller's own (pid 0) may change.
    "prlimit64": _deny(
        302,
        "lowers another process's limits: RLIMIT_CPU under what it used kills the supervisor",
        unless=(SELF, (Equals(low(2), 0), Equals(high(2), 0))),  # or no new limit (NULL): a read, as /proc's limits
    ),
    "setpriority": _deny(
        141,
        "renices another process, a process group or every process of the uid (the fork server: every later job)",
        unless=((Equals(low(0), PRIO_PROCESS), Equals(low(1), 0)),),  # a group may be another's: setpgid reaches it
    ),
    "sched_setaffinity": _deny(203, "pins another process to one CPU", unless=(SELF,)),
    "sched_setscheduler": _deny(144, "changes another process's scheduling policy (SCHED_IDLE)", unless=(SELF,)),
    "sched_setparam": _deny(142, "changes another process's scheduling priority", unless=(SELF,)),
    "sched_setattr": _deny(314, "changes another process's policy, nice value or utilization clamps", unless=(SELF,)),
    "ioprio_set": _deny(
        251,
        "gives another process, group or the uid's processes the idle I/O class",
        unless=((Equals(low(0), IOPRIO_WHO_PROCESS), Equals(low(1), 0)),),
    ),
    # SysV IPC: objects that outlive their job and that every job of the uid reaches (ENOSYS: no SysV IPC here).
    "shmget": _nosys(29, "a shared memory segment: outlives its job and the supervisor, charged to no job"),
    "shmat": _nosys(30, "attaches any job's segment of the uid: reads and writes it"),
    "shmdt": _nosys(67, "SysV shared memory"),
    "shmctl": _nosys(31, "SysV shared memory: lists, changes, removes any job's segment"),
    "msgget": _nosys(68, "a message queue: outlives its job, any job of the uid reads it"),
    "msgsnd": _nosys(69, "SysV message queues"),
    "msgrcv": _nosys(70, "SysV message queues: reads another job's messages"),
    "msgctl": _nosys(71, "SysV message queues"),
    "semget": _nosys(64, "a semaphore set: outlives its job, any job of the uid changes it"),
    "semop": _nosys(65, "SysV semaphores: blocks or wakes another job"),
    "semtimedop": _nosys(220, "SysV semaphores"),
    "semctl": _nosys(66, "SysV semaphores"),
}
# Refused only in a job's sandbox on a kernel whose Landlock cannot judge it (ABI 2, Linux 5.19-6.1): truncate(2)
# changes a file by its path without opening it, which Landlock judges from ABI 3 on (ftruncate needs a descriptor
# opened for writing, which it judges from the first).
TRUNCATE_BY_PATH = {"truncate": _deny(76, "shortens a file by its path, unjudged by Landlock before ABI 3")}
# Not refused, though near: name_to_handle_at (a handle is harmless without open_by_handle_at; systemd and libmount
# read mount ids with it), personality (programs query it; with no_new_privs a weakened layout reaches no setuid
# binary), pidfd_open and pidfd_send_signal (kill(2) reaches the same processes), migrate_pages and move_pages on
# another pid (the kernel's ptrace access check: the supervisor and fork server are not dumpable, another job's worker
# is in another Landlock domain), setrlimit (the caller's own limits only).


Target: TypeAlias = int | str | None  # an action to return (ALLOW, ERRNO | errno), a label, or None: the next one
Instruction: TypeAlias = tuple[int, Target, Target, int]  # code, where it jumps if true, if false, its constant


def _assemble(body: list[Instruction | str]) -> bytes:
    """``body``'s instructions, then a return of each action its jumps name. A str in ``body`` labels the instruction
    after it, for the jumps that name it (forward only, as BPF's). ALLOW is the first action: where ``body`` ends up
    when it falls through."""
    labels: dict[Target, int] = {}
    instructions: list[Instruction] = []
    for item in body:
        if isinstance(item, str):
            labels[item] = len(instructions)
        else:
            instructions.append(item)
    targets = [target for instruction in instructions for target in instruction[1:3] if isinstance(target, int)]
    actions = list(dict.fromkeys([ALLOW, *targets]))
    at = labels | {action: len(instructions) + index for index, action in enumerate(actions)}
    program = []
    for index, (code, when_true, when_false, value) in enumerate(instructions):
        offsets = [0 if target is None else at[target] - index - 1 for target in (when_true, when_false)]
        if not all(0 <= offset <= MAX_JUMP for offset in offsets):
            raise ValueError(f"instruction {index}: a jump of {offsets} does not fit in a byte")
        program.append(struct.pack("=HBBI", code, *offsets, value))
    program += [struct.pack("=HBBI", RETURN, 0, 0, action) for action in actions]
    return b"".join(program)


def _judge(name: str, refusal: Refusal) -> list[Instruction | str]:
    """The arguments of a call that ``refusal`` lets through in some cases: ALLOW as soon as every check of one of
    its ``unless`` holds, else its error. Labelled with ``name``, where the call's number jumps to."""
    body: list[Instruction | str] = [name]
    for index, checks in enumerate(refusal.unless):
        last = index == len(refusal.unless) - 1
        failed = ERRNO | refusal.error if last else f"{name}, case {index + 1}"
        for position, check in enumerate(checks):
            held = ALLOW if position == len(checks) - 1 else None
            body.append((LOAD, None, None, check.word))
            if isinstance(check, Equals):
                body.append((JUMP_IF_EQUAL, held, failed, check.value))
            else:
                body.append((JUMP_IF_ANY_BIT, failed, held, check.bits))
        if isinstance(failed, str):  # not the last case: the next one's label, where this one's failed check goes on
            body.append(failed)
    return body


def x86_64_filter(refused: Mapping[str, Refusal] = REFUSED) -> bytes:
    """The ABI first, then each refused call's number: an unconditional refusal returns its error there, the others
    jump to the checks of their arguments, after every number."""
    nosys = ERRNO | errno.ENOSYS
    return _assemble(
        [
            (LOAD, None, None, ARCH),
            (JUMP_IF_EQUAL, None, nosys, AUDIT_ARCH_X86_64),
            (LOAD, None, None, NR),
            (JUMP_IF_ANY_BIT, nosys, None, X32_BIT),
            *(
                (JUMP_IF_EQUAL, name if refusal.unless else ERRNO | refusal.error, None, refusal.number)
                for name, refusal in refused.items()
            ),
            (RETURN, None, None, ALLOW),
            *(item for name, refusal in refused.items() if refusal.unless for item in _judge(name, refusal)),
        ]
    )


def clone3_filter() -> bytes:
    return _assemble([(LOAD, None, None, NR), (JUMP_IF_EQUAL, ERRNO | errno.ENOSYS, None, CLONE3)])


def native_x86_64() -> bool:
    """This process makes x86_64 calls (not an i386 or x32 Python on an x86_64 kernel)."""
    return os.uname().machine == "x86_64" and ctypes.sizeof(ctypes.c_void_p) == 8


_libc = ctypes.CDLL(None, use_errno=True)


class _Program(ctypes.Structure):
    _fields_ = [("length", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def refuse_unneeded_calls(more: Mapping[str, Refusal] | None = None) -> frozenset[str]:
    """Set no_new_privs, then install the filter on this thread: both hold for every child it forks from now on.
    The names of the calls now refused: all of ``REFUSED`` (and ``more``) on x86_64, only clone3 on another machine,
    none where the kernel has no seccomp filters."""
    refused = {**REFUSED, **(more or {})}
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"prctl(PR_SET_NO_NEW_PRIVS): {errno.errorcode.get(code, code)}")
    native = native_x86_64()
    instructions = x86_64_filter(refused) if native else clone3_filter()
    program = _Program(len(instructions) // 8, instructions)
    if _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0) != 0:
        code = ctypes.get_errno()
        if code == errno.EINVAL:
            return frozenset()
        raise OSError(code, f"prctl(PR_SET_SECCOMP): {errno.errorcode.get(code, code)}")
    return frozenset(refused) if native else frozenset({"clone3"})
