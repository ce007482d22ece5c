"""What a hostile crew tries on the kernel and on other processes, most through ctypes' ``syscall``: the name of the
errno each call got, or ``ok``. Run inside a worker (``tests/crews/prober.py``'s prober) and in a process
that installs the filter itself (``tests/worker/test_seccomp.py``). Every call is harmless should it pass: a mount
on a path that does not exist, a clone whose child leaves at once, a tracee detached again."""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import resource
import signal
import socket
import struct
from collections.abc import Callable

import psutil

from worker.seccomp import CLONE, IOPRIO_WHO_PROCESS, REFUSED

PTRACE_ATTACH, PTRACE_DETACH = 16, 17
WALL = 0x40000000  # __WALL: wait for a tracee that is not our child
CLONE_NEWUSER = 0x10000000
KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING = 0, -3
UFFD_USER_MODE_ONLY = 1
NOWHERE = b"/nonexistent-crew-supervisor-mount"  # a mount the filter let through fails with ENOENT: nothing mounted
PRLIMIT64, SCHED_SETATTR, IOPRIO_SET = (REFUSED[name].number for name in ("prlimit64", "sched_setattr", "ioprio_set"))
IOPRIO_WHO_PGRP, IOPRIO_WHO_USER = 2, 3
IOPRIO_IDLE, IOPRIO_BEST_EFFORT_LOW = 3 << 13, 2 << 13 | 7  # class << IOPRIO_CLASS_SHIFT | level
NICEST = 19
NO_ONE = 0x7FFFFFF0  # a uid no process has
JOIN_REFUSED = 255  # the exit status of a child that could not join a process group
IPC_PRIVATE, IPC_RMID = 0, 0
I386_GETPID = bytes.fromhex("b814000000" + "cd80" + "c3")  # mov eax, 20 (i386's getpid); int 0x80; ret

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


def _call(name: str, *args: object) -> int:
    """The call of that name in worker.seccomp's table (its x86_64 number); raises OSError as the kernel refuses."""
    result = libc.syscall(ctypes.c_long(REFUSED[name].number), *args)
    if result < 0:
        raise OSError(ctypes.get_errno(), name)
    return int(result)


def outcome(attack: Callable[[], object]) -> str:
    try:
        attack()
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))
    return "ok"


def attach(pid: int) -> None:
    _call("ptrace", ctypes.c_long(PTRACE_ATTACH), ctypes.c_long(pid), None, None)
    os.waitpid(pid, WALL)  # it worked (the test will fail): leave the target running as it was
    libc.ptrace(PTRACE_DETACH, pid, None, None)


def _read_memory(pid: int) -> None:
    try:
        with open(f"/proc/{pid}/maps") as maps:
            start = int(maps.readline().split("-")[0], 16)
    except PermissionError:  # another Landlock domain (a spawned worker's): the call itself is still what counts
        start = mmap.PAGESIZE
    buffer = ctypes.create_string_buffer(64)
    local, remote = _IoVec(ctypes.addressof(buffer), 64), _IoVec(start, 64)
    _call("process_vm_readv", ctypes.c_long(pid), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)


def steal_descriptor(pid: int) -> None:
    pidfd = os.pidfd_open(pid)
    try:
        os.close(_call("pidfd_getfd", pidfd, 2, 0))
    finally:
        os.close(pidfd)


def open_memory(pid: int) -> None:
    """Open another process's memory through /proc (a ptrace access check, not a call the filter can see)."""
    with open(f"/proc/{pid}/mem", "rb"):
        pass


def read_environ(pid: int) -> None:
    with open(f"/proc/{pid}/environ", "rb") as environ:
        environ.read()


def connect_abstract(name: str) -> None:
    """Connect to the abstract unix socket ``name`` (no file: only Landlock's scoping keeps it from a job)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.connect("\0" + name)


def child_by_call(number: int, *args: object) -> None:
    """A clone-like call that, should it pass, makes a child that leaves at once; OSError as the kernel refuses."""
    pid = libc.syscall(ctypes.c_long(number), *args)
    if pid == 0:
        os._exit(0)
    if pid < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    os.waitpid(pid, 0)


def _clone3() -> None:
    args = ctypes.create_string_buffer(struct.pack("=8Q", 0, 0, 0, 0, signal.SIGCHLD, 0, 0, 0), 64)
    child_by_call(REFUSED["clone3"].number, args, ctypes.c_size_t(64))


def _perf_event() -> None:
    # struct perf_event_attr, its first version (64 bytes): the task's own CPU clock, disabled, user space only.
    attr = struct.pack("=IIQQQQQII", 1, 64, 0, 0, 0, 0, 1 | 1 << 5 | 1 << 6, 0, 0) + bytes(8)
    os.close(_call("perf_event_open", attr, 0, -1, -1, 0))


def _bpf_map() -> None:
    attr = struct.pack("=IIII", 2, 4, 4, 1)  # BPF_MAP_CREATE of an array: one 4-byte value at a 4-byte key
    os.close(_call("bpf", 0, attr, len(attr)))


def _open_by_handle() -> None:
    handle = struct.pack("=Ii", 8, 1) + bytes(8)  # struct file_handle: 8 bytes of handle, type 1
    root = os.open(
        ".", os.O_RDONLY | os.O_DIRECTORY
    )  # its own: a job's sandbox lets it list no ancestor of a hidden path
    try:
        os.close(_call("open_by_handle_at", root, handle, os.O_RDONLY))
    finally:
        os.close(root)


def attacks(target: int) -> dict[str, str]:
    """Each attack's outcome: on ``target`` (another process, alive and ours to reach but for the filter), on the
    kernel, and clone3 (ENOSYS under the filter)."""
    return {
        "ptrace": outcome(lambda: attach(target)),
        "process_vm_readv": outcome(lambda: _read_memory(target)),
        "pidfd_getfd": outcome(lambda: steal_descriptor(target)),
        "unshare": outcome(lambda: _call("unshare", CLONE_NEWUSER)),
        "clone": outcome(lambda: child_by_call(CLONE, ctypes.c_long(CLONE_NEWUSER | signal.SIGCHLD), 0, 0, 0, 0)),
        "mount": outcome(lambda: _call("mount", b"none", NOWHERE, b"tmpfs", 0, None)),
        "keyctl": outcome(lambda: _call("keyctl", KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 1)),
        "bpf": outcome(_bpf_map),
        "perf_event_open": outcome(_perf_event),
        "userfaultfd": outcome(lambda: os.close(_call("userfaultfd", os.O_CLOEXEC | UFFD_USER_MODE_ONLY))),
        "open_by_handle_at": outcome(_open_by_handle),
        "clone3": outcome(_clone3),
    }


def i386_getpid() -> str:
    """getpid through ``int 0x80``, the i386 ABI an x86_64 process can still use, in a child: ``ENOSYS``, ``ok``, or
    ``no i386`` where the kernel has no i386 emulation (the child then dies of SIGSEGV)."""
    pid = os.fork()
    if pid == 0:
        code = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        code.write(I386_GETPID)
        result = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(code)))()
        os._exit(1 if result == -errno.ENOSYS else 0)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return "no i386"
    return "ENOSYS" if os.WEXITSTATUS(status) == 1 else "ok"


def every_refused() -> dict[str, str]:
    """Each call of the table with every argument -1: none of them can do anything with that, filter or not (but
    msgget, whose flags would then hold IPC_CREAT: it gets 0 for them, and only looks a queue up)."""
    arguments = {name: [ctypes.c_long(-1)] * 6 for name in REFUSED} | {"msgget": [ctypes.c_long(-1), 0]}
    return {name: outcome(lambda name=name: _call(name, *arguments[name])) for name in REFUSED}


def _changed(number: int, *args: object) -> None:
    if libc.syscall(ctypes.c_long(number), *args) < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _sched_attr(policy: int, nice: int) -> bytes:
    """struct sched_attr, its first version (48 bytes): a policy and, for SCHED_OTHER or SCHED_BATCH, a nice value."""
    return struct.pack("=IIQiIQQQ", 48, policy, 0, nice, 0, 0, 0, 0)


def observe(pid: int) -> dict[str, object]:
    """What the calls of ``reach_others`` would change in ``pid``, read without changing it (allowed, filter or
    not): its open files' limits, nice value, CPUs, scheduling policy and I/O priority."""
    process = psutil.Process(pid)
    with open(f"/proc/{pid}/limits") as limits:  # anyone's to read (psutil's prlimit needs CAP_SYS_RESOURCE)
        nofile = next(line for line in limits if line.startswith("Max open files")).split()[3:5]
    return {
        "nofile": nofile,
        "nice": process.nice(),
        "affinity": sorted(process.cpu_affinity()),
        "policy": os.sched_getscheduler(pid),
        "ionice": [int(process.ionice().ioclass), process.ionice().value],
    }


def _in_group_of(pid: int, call: Callable[[], object]) -> str:
    """What ``call`` gave in a child that first joins ``pid``'s process group (setpgid takes any group of the caller's
    session, and a worker is in the supervisor's): a group-wide call with who 0 would then reach that group."""
    child = os.fork()
    if child == 0:
        try:
            os.setpgid(0, os.getpgid(pid))
        except OSError:
            os._exit(JOIN_REFUSED)
        try:
            call()
        except OSError as exc:
            os._exit(exc.errno or JOIN_REFUSED)
        os._exit(0)
    code = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
    return "setpgid refused" if code == JOIN_REFUSED else errno.errorcode.get(code, "ok")


def reach_others(pid: int) -> dict[str, str]:
    """Each call that changes another process, on ``pid`` (of our uid: the kernel would let them all through) and
    on its process group; ``observe`` tells whether it changed. Harmless should they pass: one open file less,
    nice 19, the first of its CPUs, SCHED_IDLE, the idle I/O class."""
    try:
        soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)  # a read: allowed, but for another uid's process
    except OSError:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # to change it the kernel refuses as well
    group = os.getpgid(pid)
    first_cpu = {min(os.sched_getaffinity(pid))}
    return {
        "prlimit_read": outcome(lambda: resource.prlimit(pid, resource.RLIMIT_NOFILE)),
        "prlimit": outcome(lambda: resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft - 1, hard))),
        "setpriority": outcome(lambda: os.setpriority(os.PRIO_PROCESS, pid, NICEST)),
        "setpriority_group": outcome(lambda: os.setpriority(os.PRIO_PGRP, group, NICEST)),
        "setpriority_joined_group": _in_group_of(pid, lambda: os.setpriority(os.PRIO_PGRP, 0, NICEST)),
        "sched_setaffinity": outcome(lambda: os.sched_setaffinity(pid, first_cpu)),
        "sched_setscheduler": outcome(lambda: os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))),
        "sched_setparam": outcome(lambda: os.sched_setparam(pid, os.sched_param(0))),
        "sched_setattr": outcome(lambda: _changed(SCHED_SETATTR, pid, _sched_attr(os.SCHED_OTHER, NICEST), 0)),
        "ioprio_set": outcome(lambda: _changed(IOPRIO_SET, IOPRIO_WHO_PROCESS, pid, IOPRIO_IDLE)),
        "ioprio_set_group": outcome(lambda: _changed(IOPRIO_SET, IOPRIO_WHO_PGRP, group, IOPRIO_IDLE)),
    }


def _psutil_outcome(call: Callable[[], object]) -> str:
    """``outcome`` of a psutil call, which says EPERM as ``psutil.AccessDenied``."""
    try:
        return outcome(call)
    except psutil.AccessDenied:
        return "AccessDenied"


def change_itself() -> dict[str, str]:
    """The same calls on the caller itself as the C library and Python make them (pid 0), each to what it has or
    a little nicer; reading another's limits; and psutil's setter, which names the caller's pid."""
    nice = min(os.getpriority(os.PRIO_PROCESS, 0) + 1, NICEST)
    policy = os.sched_getscheduler(0)
    return {
        "setrlimit": outcome(
            lambda: resource.setrlimit(resource.RLIMIT_NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE))
        ),
        "prlimit_read": outcome(lambda: resource.prlimit(os.getpid(), resource.RLIMIT_NOFILE)),  # psutil's rlimit()
        "nice": outcome(lambda: os.nice(1)),
        "setpriority": outcome(lambda: os.setpriority(os.PRIO_PROCESS, 0, nice)),
        "sched_setaffinity": outcome(lambda: os.sched_setaffinity(0, os.sched_getaffinity(0))),
        "sched_setscheduler": outcome(lambda: os.sched_setscheduler(0, policy, os.sched_param(0))),
        "sched_setparam": outcome(lambda: os.sched_setparam(0, os.sched_param(0))),
        "sched_setattr": outcome(lambda: _changed(SCHED_SETATTR, 0, _sched_attr(policy, nice), 0)),
        "ioprio_set": outcome(lambda: _changed(IOPRIO_SET, IOPRIO_WHO_PROCESS, 0, IOPRIO_BEST_EFFORT_LOW)),
        "psutil_nice": _psutil_outcome(lambda: psutil.Process().nice(nice)),
    }


def odd_arguments(pid: int) -> dict[str, str]:
    """Arguments a filter could misread: a pointer whose low word is 0 (not NULL: no read of limits), a pid whose
    high word is set (the kernel reads the low one: ourselves), and the calls that reach every process of a uid
    (one with no process, so that they change nothing should they pass: ESRCH)."""
    low_word_only = ctypes.c_long(1 << 32)
    core = struct.pack("=QQ", *(limit & (1 << 64) - 1 for limit in resource.getrlimit(resource.RLIMIT_CORE)))
    return {
        "prlimit_pointer": outcome(lambda: _changed(PRLIMIT64, pid, resource.RLIMIT_NOFILE, low_word_only, None)),
        "prlimit_own_high_word": outcome(lambda: _changed(PRLIMIT64, low_word_only, resource.RLIMIT_CORE, core, None)),
        "setpriority_user": outcome(lambda: os.setpriority(os.PRIO_USER, NO_ONE, NICEST)),
        "setpriority_own_group": outcome(lambda: os.setpriority(os.PRIO_PGRP, 0, os.getpriority(os.PRIO_PGRP, 0))),
        "ioprio_set_user": outcome(lambda: _changed(IOPRIO_SET, IOPRIO_WHO_USER, NO_ONE, IOPRIO_IDLE)),
        "ioprio_set_own_group": outcome(lambda: _changed(IOPRIO_SET, IOPRIO_WHO_PGRP, 0, IOPRIO_BEST_EFFORT_LOW)),
    }


def sysv() -> dict[str, str]:
    """A private SysV shared memory segment, message queue and semaphore set, each removed at once should it be made."""
    return {
        "shmget": outcome(lambda: _call("shmctl", _call("shmget", IPC_PRIVATE, 4096, 0o600), IPC_RMID, None)),
        "msgget": outcome(lambda: _call("msgctl", _call("msgget", IPC_PRIVATE, 0o600), IPC_RMID, None)),
        "semget": outcome(lambda: _call("semctl", _call("semget", IPC_PRIVATE, 1, 0o600), 0, IPC_RMID)),
    }
