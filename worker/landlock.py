"""Landlock: what a worker process may reach on the file system, and which processes it may reach, set by the
process on itself, for good (no privilege needed; its children inherit it; a later domain only narrows it).

With jobs sandboxed (the supervisor's ``WORKER_SANDBOX``, on by default), two domains, one inside the other:

- The workers' domain. Every worker process (the fork server, a spawned worker) enters it when it starts, before
  the registry (crew code) is imported: everything is readable but what the supervisor hides (the state
  directory, the token's file, the crews' env files, the training directory), and writable only in the workers'
  places (the state directory's ``home``, ``storage``, ``tmp`` and ``scratch``, the training directory).
- The job's domain. A worker that takes a job enters it before the crew is built: readable as the workers', and
  writable only in the job's own places (its scratch directory, its crew's HOME and storage; the training
  directory to train). Its idle pre-forked worker makes it ahead, up to the places.

A domain also keeps every process outside it out of its processes' reach: the kernel lets a process trace, read
through ``/proc/<pid>/mem`` or take a descriptor (``pidfd_getfd``) only of processes in its own domain or one
nested in it, and (ABI 6) signal only those, and connect only to their abstract unix sockets. Another job's
worker (a sibling domain), the fork server (the outer one) and the supervisor (in none) are out of a job's reach.

With jobs unsandboxed, every worker process still denies itself any change to a cgroup file system
(``deny_cgroup_writes``): a worker that is uid 0 with every capability dropped still passes the owner check on
root-owned 0644 files, the cgroup files among them, and writing its pid into a root cgroup's ``cgroup.procs``
would take it out of its job's cgroup, and so out of every cap and out of the kill that ends its job (the
sandbox denies that too: no cgroup file is a workers' place).

Landlock is an allow-list: to hide a path, each of its siblings (and its ancestors' siblings) gets a rule
(``allowed_around``). Where the kernel has no Landlock, or only its first ABI (which refuses every rename across
directories, so would break crews), no rule is set, and the supervisor says so (``/health``'s ``sandbox`` and
``containment``).
"""

from __future__ import annotations

import ctypes
import os
import stat
import struct

from protocol import LANDLOCK_ABI, Layer

# The syscalls' numbers are the same on every architecture (added after the tables were unified).
CREATE_RULESET, ADD_RULE, RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38
CGROUP_ROOT = "/sys/fs/cgroup"

# The file system rights (uapi/linux/landlock.h), with the ABI that brought each.
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR, REMOVE_DIR, REMOVE_FILE = (1 << bit for bit in range(6))
MAKE_CHAR, MAKE_DIR, MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = (1 << bit for bit in range(6, 13))
REFER = 1 << 13  # ABI 2: handled or not, moving a file between directories is refused unless granted
TRUNCATE = 1 << 14  # ABI 3
READS = EXECUTE | READ_FILE | READ_DIR
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
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE  # all a rule on a file (not a directory) may grant
# ABI 6: what a domain keeps to itself. The ruleset's attributes grew a field per feature (net ports at ABI 4).
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1
SCOPED_SINCE = LANDLOCK_ABI[Layer.SIGNALS]
# Devices any program writes to (``subprocess.DEVNULL``, ``open("/dev/null", "w")``): no one's data.
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def abi() -> int:
    """The kernel's Landlock ABI version; 0 where it has none (or has it off)."""
    version = _libc.syscall(CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))
    return max(int(version), 0)


def layers(version: int) -> list[Layer]:
    """What a job's domain holds on a kernel of Landlock ABI ``version``."""
    return [layer for layer, since in LANDLOCK_ABI.items() if version >= since]


def deny_cgroup_writes() -> bool:
    """From now on this process and its children cannot change any cgroup file system; True if the kernel
    enforces it. Sets no_new_privs, which Landlock needs without CAP_SYS_ADMIN."""
    version = abi()
    if version < 2:
        return False
    handled = _writes(version)
    ruleset = Ruleset(handled)
    for path in allowed_around(cgroup_mounts()):
        ruleset.allow(path, handled)
    ruleset.restrict()
    return True


class Ruleset:
    """A Landlock ruleset being made: rules added, then ``restrict`` makes it this process's next domain."""

    def __init__(self, handled: int, scoped: int = 0) -> None:
        self.handled = handled
        attr = struct.pack("=QQQ", handled, 0, scoped) if scoped else struct.pack("=Q", handled)
        # The kernel makes it close-on-exec: nothing the job runs inherits it.
        self.fd = _check(_libc.syscall(CREATE_RULESET, attr, ctypes.c_size_t(len(attr)), 0), "create")

    def allow(self, path: str, rights: int) -> None:
        """Grant ``rights`` (those the kernel knows) beneath ``path`` (a file: what a file can have), if it can still
        be opened: what is no longer there, or not ours to open, stays out of reach."""
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:  # gone since it was listed, or not ours to open: it stays out of reach
            return
        try:
            rights &= self.handled
            if not stat.S_ISDIR(os.fstat(fd).st_mode):  # as it is now, not as it was listed
                rights &= FILE_RIGHTS
            attr = struct.pack("=Qi", rights, fd)  # struct landlock_path_beneath_attr is packed
            _check(_libc.syscall(ADD_RULE, self.fd, RULE_PATH_BENEATH, attr, 0), f"add_rule {path}")
        finally:
            os.close(fd)

    def restrict(self) -> None:
        try:
            _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
            _check(_libc.syscall(RESTRICT_SELF, self.fd, 0), "restrict_self")
        finally:
            os.close(self.fd)


class Hiding:
    """Everything around the hidden paths, listed once, when a worker process starts (before the registry is
    imported): its domain and its job's are made from this one listing.

    The listing cannot be taken again later: inside its own domain a process may not list a directory that
    holds a hidden path (reading it would be reading beneath it). So what is created afterwards directly in such
    a directory (``/``, each directory above the state directory, the token's, the env files') stays out of reach
    of this process's jobs; anything beneath what was there is reachable."""

    def __init__(self, hidden: list[str]) -> None:
        self.version = abi()
        denied = {os.path.realpath(path) for path in hidden if os.path.lexists(path)}
        self.around = allowed_around(denied) if self.version >= 2 else []

    def ruleset(self) -> Ruleset | None:
        """A domain in the making: everything around readable, the usual devices writable, nothing outside it
        traced, read through /proc or (ABI 6) signalled; None on a kernel without Landlock ABI 2. An idle worker
        makes its job's ahead (``enter``)."""
        if self.version < 2:
            return None
        scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if self.version >= SCOPED_SINCE else 0
        ruleset = Ruleset(READS | _writes(self.version), scoped)
        for path in self.around:
            ruleset.allow(path, READS)
        for device in DEVICES:
            ruleset.allow(device, WRITE_FILE | TRUNCATE)
        return ruleset

    def enter(self, writable: list[str], ruleset: Ruleset | None = None) -> list[Layer]:
        """Make this process's next domain: nothing hidden readable, nothing but beneath ``writable`` changed (those
        may lie beneath a hidden path: a job's places are in the state directory), no process outside it reached.
        ``ruleset`` if made ahead. The layers it holds (``layers``): none without Landlock ABI 2. A writable place
        that does not exist stays unwritable."""
        ruleset = ruleset or self.ruleset()
        if ruleset is None:
            return []
        for place in writable:
            ruleset.allow(place, READS | _writes(self.version))
        ruleset.restrict()
        return layers(self.version)


def cgroup_mounts() -> set[str]:
    """Every place a cgroup file system is mounted, as this process sees them (a bind mount elsewhere too)."""
    mounts = {CGROUP_ROOT}
    with open("/proc/self/mountinfo") as info:
        for line in info:
            fields = line.split()
            # ... mount point (4), optional fields, then "-", the file system's type.
            kind = fields[fields.index("-") + 1]
            if kind in ("cgroup", "cgroup2"):
                mounts.add(fields[4].replace("\\040", " "))
    return mounts


def allowed_around(denied: set[str], root: str = "/") -> list[str]:
    """The paths beneath which everything lies but ``denied``: each sibling along the way down to one.

    Symbolic links are left out: Landlock judges the path a link resolves to, so the link needs no rule
    (and one that points into ``denied`` must not get one). A directory this process may pass but not list (0711)
    has no sibling to name: nothing beneath it is allowed."""
    through = {ancestor for place in denied for ancestor in _ancestors(place)}
    allowed: list[str] = []
    pending = [root]
    while pending:
        try:
            listing = os.scandir(pending.pop())
        except PermissionError:
            continue
        with listing as entries:
            for entry in entries:
                path = entry.path
                if path in denied or entry.is_symlink():
                    continue
                if path in through:
                    pending.append(path)
                else:
                    allowed.append(path)
    return allowed


def _ancestors(path: str) -> list[str]:
    found = []
    while (parent := os.path.dirname(path)) != path:
        found.append(parent)
        path = parent
    return found


def _writes(version: int) -> int:
    """The rights that change the file system, as far as the kernel knows them."""
    handled = 0
    for since, rights in WRITES_BY_ABI.items():
        if version >= since:
            handled |= rights
    return handled


def _check(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"landlock {what}: {os.strerror(code)}")
    return result
