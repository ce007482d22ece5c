"""Landlock: what a worker process may change on the file system, set by the process on itself, for good.

A worker that is uid 0 with every capability dropped still passes the owner check on root-owned 0644 files,
the cgroup files among them: writing its pid into a root cgroup's ``cgroup.procs`` would take it out of its
job's cgroup, and so out of every cap and out of the kill that ends its job. Landlock (Linux 5.13, no
privilege needed) is an allow-list the process cannot widen again and its children inherit: here every
right to change the file system is handled, and granted beneath every path but the cgroup file systems
(each place one is mounted, ``/sys/fs/cgroup`` always). Reading is not handled here.

Set in ``lifecycle.confine``, after ``seccomp.refuse_unneeded_calls`` (whose clone3 refusal closes the other
way into another cgroup): the fork server's domain is its workers' too. Where the kernel has no Landlock, or
only its first ABI (which refuses every rename across directories, so would break crews), no rule is set, and
the supervisor says so (``/health``'s ``containment``).
"""

from __future__ import annotations

import ctypes
import os
import struct
from pathlib import Path

# The syscalls' numbers are the same on every architecture (added after the tables were unified).
CREATE_RULESET, ADD_RULE, RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38
CGROUP_ROOT = "/sys/fs/cgroup"

# The rights that change the file system (uapi/linux/landlock.h), with the ABI that brought each.
WRITE_FILE, REMOVE_DIR, REMOVE_FILE = 1 << 1, 1 << 4, 1 << 5
MAKE_CHAR, MAKE_DIR, MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = (1 << bit for bit in range(6, 13))
REFER = 1 << 13  # ABI 2: handled or not, moving a file between directories is refused unless granted
TRUNCATE = 1 << 14  # ABI 3
WRITES_BY_ABI = {
    1: WRITE_FILE
    | REMOVE_DIR
    | REMOVE_FILE
    | MAKE_CHAR
    | MAKE_DIR
    | MAKE_REG
    | MAKE_SOCK
    | MAKE_FIFO
    | MAKE_BLOCK
    | MAKE_SYM,
    2: REFER,
    3: TRUNCATE,
}
FILE_RIGHTS = WRITE_FILE | TRUNCATE  # all a rule on a file (not a directory) may grant

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def abi() -> int:
    """The kernel's Landlock ABI version; 0 where it has none (or has it off)."""
    version = _libc.syscall(CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))
    return max(int(version), 0)


def deny_cgroup_writes() -> bool:
    """From now on this process and its children cannot change any cgroup file system; True if the kernel
    enforces it. Sets no_new_privs, which Landlock needs without CAP_SYS_ADMIN."""
    version = abi()
    if version < 2:  # ABI 1 refuses every rename and link across directories: it would break crews
        return False
    handled = 0
    for since, rights in WRITES_BY_ABI.items():
        if version >= since:
            handled |= rights
    ruleset = _check(_libc.syscall(CREATE_RULESET, struct.pack("=Q", handled), ctypes.c_size_t(8), 0), "create")
    try:
        for path in allowed_around(cgroup_mounts()):
            _allow(ruleset, path, handled)
        _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
        _check(_libc.syscall(RESTRICT_SELF, ruleset, 0), "restrict_self")
    finally:
        os.close(ruleset)
    return True


def cgroup_mounts() -> set[Path]:
    """Every place a cgroup file system is mounted, as this process sees them (a bind mount elsewhere too)."""
    mounts = {Path(CGROUP_ROOT)}
    with open("/proc/self/mountinfo") as info:
        for line in info:
            fields = line.split()
            # ... mount point (4), optional fields, then "-", the file system's type.
            kind = fields[fields.index("-") + 1]
            if kind in ("cgroup", "cgroup2"):
                mounts.add(Path(fields[4].replace("\\040", " ")))
    return mounts


def allowed_around(denied: set[Path], root: Path = Path("/")) -> list[Path]:
    """The paths beneath which everything lies but ``denied``: each sibling along the way down to one.

    Symbolic links are left out: Landlock judges the path a link resolves to, so the link needs no rule
    (and one that points into ``denied`` must not get one)."""
    allowed: list[Path] = []
    with os.scandir(root) as entries:
        for entry in entries:
            path = Path(entry.path)
            if path in denied or entry.is_symlink():
                continue
            if entry.is_dir() and any(path in place.parents for place in denied):
                allowed.extend(allowed_around(denied, path))
            elif entry.is_dir() or entry.is_file():
                allowed.append(path)
    return allowed


def _allow(ruleset: int, path: Path, handled: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:  # gone since it was listed, or not ours to open: it stays unwritable
        return
    try:
        rights = handled if os.path.isdir(f"/proc/self/fd/{fd}") else handled & FILE_RIGHTS
        attr = struct.pack("=Qi", rights, fd)  # struct landlock_path_beneath_attr is packed
        _check(_libc.syscall(ADD_RULE, ruleset, RULE_PATH_BENEATH, attr, 0), f"add_rule {path}")
    finally:
        os.close(fd)


def _check(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"landlock {what}: {os.strerror(code)}")
    return result
