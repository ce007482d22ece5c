"""Seccomp: the system calls a worker process refuses itself, for good (its children inherit the filter).

For now one: ``clone3``, whose ``CLONE_INTO_CGROUP`` starts a child in any cgroup v2 directory the process can
open, read-only too: Landlock, which judges opening and changing files, cannot see it, so a job could start a
process outside its own cgroup and every cap and kill on it. Refused with ENOSYS, as a kernel without it would:
glibc (``posix_spawn``, ``pthread_create``) then falls back to ``clone``, which has no such flag.
"""

from __future__ import annotations

import ctypes
import errno
import struct

PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
CLONE3 = 435  # the same number on every architecture, its compat ABIs included
X32_BIT = 0x40000000  # x86_64's x32 ABI numbers its calls with this bit set
# Classic BPF over struct seccomp_data, whose first word is the call's number.
LOAD_NR, JUMP_IF_EQUAL, RETURN = 0x20, 0x15, 0x06
ALLOW, ERRNO = 0x7FFF0000, 0x00050000

_libc = ctypes.CDLL(None, use_errno=True)


class _Program(ctypes.Structure):
    _fields_ = [("length", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def _instruction(code: int, jump_true: int, jump_false: int, value: int) -> bytes:
    return struct.pack("=HBBI", code, jump_true, jump_false, value)


FILTER = b"".join(
    (
        _instruction(LOAD_NR, 0, 0, 0),
        _instruction(JUMP_IF_EQUAL, 2, 0, CLONE3),  # to the refusal, two on
        _instruction(JUMP_IF_EQUAL, 1, 0, CLONE3 | X32_BIT),
        _instruction(RETURN, 0, 0, ALLOW),
        _instruction(RETURN, 0, 0, ERRNO | errno.ENOSYS),
    )
)


def refuse_clone3() -> bool:
    """Install the filter on this thread (and so on every child it forks from now on); needs no_new_privs (or
    CAP_SYS_ADMIN). False where the kernel has no seccomp filters."""
    program = _Program(len(FILTER) // 8, FILTER)
    if _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0) != 0:
        code = ctypes.get_errno()
        if code == errno.EINVAL:
            return False
        raise OSError(code, f"prctl(PR_SET_SECCOMP): {errno.errorcode.get(code, code)}")
    return True
