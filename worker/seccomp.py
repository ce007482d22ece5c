"""Seccomp: the system calls a worker process refuses itself, for good (its children inherit the filter).

``REFUSED`` is the table: each call's x86_64 number, the errno it gets and why a crew never needs it. Two kinds:

- ``clone3``, whose ``CLONE_INTO_CGROUP`` starts a child in any cgroup v2 directory the process can open,
  read-only too: Landlock, which judges opening and changing files, cannot see it, so a job could start a process
  outside its own cgroup and every cap and kill on it. ENOSYS, as a kernel without it answers: glibc
  (``posix_spawn``, ``pthread_create``) then falls back to ``clone``, which has no such flag.
- The deny-list: calls that reach into other processes (other jobs' workers share our uid and are dumpable) or
  into the kernel's privileged surface (namespaces, mounts, modules, BPF, keyrings). EPERM, as the kernel answers
  a caller without the privilege, so a program that probes for them takes its usual fallback. ``clone`` with a
  namespace flag is refused with them, as ``unshare`` is: it is the other way to a new namespace.

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
from typing import NamedTuple

from worker.landlock import PR_SET_NO_NEW_PRIVS

PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
AUDIT_ARCH_X86_64 = 0xC000003E
X32_BIT = 0x40000000  # x86_64's x32 ABI numbers its calls with this bit set
CLONE, CLONE3 = 56, 435  # clone3's number is the same on every architecture, its compat ABIs included
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET: no thread or posix_spawn clone sets one.
CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
# Classic BPF over struct seccomp_data: nr (u32 at 0), arch (u32 at 4), ip, then args (u64 each, from 16).
NR, ARCH, FIRST_ARG_LOW = 0, 4, 16  # the first argument's low word: little-endian
LOAD, JUMP_IF_EQUAL, JUMP_IF_ANY_BIT, RETURN = 0x20, 0x15, 0x45, 0x06
ALLOW, ERRNO = 0x7FFF0000, 0x00050000
MAX_JUMP = 255  # a conditional jump's offset is one byte


class Refusal(NamedTuple):
    number: int  # x86_64's
    error: int
    reason: str


def _deny(number: int, reason: str) -> Refusal:
    return Refusal(number, errno.EPERM, reason)


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
}
# Refused only in a job's sandbox on a kernel whose Landlock cannot judge it (ABI 2, Linux 5.19-6.1): truncate(2)
# changes a file by its path without opening it, which Landlock judges from ABI 3 on (ftruncate needs a descriptor
# opened for writing, which it judges from the first).
TRUNCATE_BY_PATH = {"truncate": _deny(76, "shortens a file by its path, unjudged by Landlock before ABI 3")}
# Not refused, though near: name_to_handle_at (a handle is harmless without open_by_handle_at; systemd and libmount
# read mount ids with it), personality (programs query it; with no_new_privs a weakened layout reaches no setuid
# binary), pidfd_open and pidfd_send_signal (kill(2) reaches the same processes).


def _assemble(body: list[tuple[int, int | None, int | None, int]]) -> bytes:
    """``body``, then a return of each action its jumps name (a jump's target: an action; None: the next one).
    The first action is where ``body`` ends up when it falls through."""
    targets = [target for instruction in body for target in instruction[1:3] if target is not None]
    actions = list(dict.fromkeys([ALLOW, *targets]))
    at = {action: len(body) + index for index, action in enumerate(actions)}
    program = []
    for index, (code, when_true, when_false, value) in enumerate(body):
        offsets = [0 if target is None else at[target] - index - 1 for target in (when_true, when_false)]
        if not all(0 <= offset <= MAX_JUMP for offset in offsets):
            raise ValueError(f"instruction {index}: a jump of {offsets} does not fit in a byte")
        program.append(struct.pack("=HBBI", code, *offsets, value))
    program += [struct.pack("=HBBI", RETURN, 0, 0, action) for action in actions]
    return b"".join(program)


def x86_64_filter(refused: Mapping[str, Refusal] = REFUSED) -> bytes:
    nosys, perm = ERRNO | errno.ENOSYS, ERRNO | errno.EPERM
    return _assemble(
        [
            (LOAD, None, None, ARCH),
            (JUMP_IF_EQUAL, None, nosys, AUDIT_ARCH_X86_64),
            (LOAD, None, None, NR),
            (JUMP_IF_ANY_BIT, nosys, None, X32_BIT),
            *((JUMP_IF_EQUAL, ERRNO | refusal.error, None, refusal.number) for refusal in refused.values()),
            (JUMP_IF_EQUAL, None, ALLOW, CLONE),  # clone: refused if it asks for a namespace
            (LOAD, None, None, FIRST_ARG_LOW),
            (JUMP_IF_ANY_BIT, perm, ALLOW, CLONE_NAMESPACES),
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
