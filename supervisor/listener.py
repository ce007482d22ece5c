"""The listening address: ``serve`` takes it once nothing of a dead supervisor's jobs runs any more and before any
child of its own starts (``Supervisor.open``'s ``fenced``), and refuses a port held by another process in one line
naming it; ``doctor`` tries it and lets it go.

From its bind to uvicorn's listen (the crews' description, seconds), nobody else may bind the address: with
``SO_REUSEADDR`` a socket that is bound but not yet listening lets another socket with the option bind the same
address and listen first. So the option is set for the bind (a connection of a previous run in TIME_WAIT is no
conflict) and cleared until the listen, which needs it again for the same reason. ``SO_REUSEPORT`` is never set:
with it, any process of our uid could share the port while we serve.
"""

from __future__ import annotations

import contextlib
import errno
import shlex
import socket

import psutil

from supervisor.escaping import one_line

MAX_COMMAND_CHARS = 200  # of the holder's command line, in the refusal
WILDCARDS = ("", "0.0.0.0", "::")


class ListenError(Exception):
    """One line: the address, why it cannot be had, and who holds it if another process does."""


class Listener(socket.socket):
    """A socket bound to the address, without ``SO_REUSEADDR`` until it listens: ``serve`` calls ``listen`` itself
    (uvloop would listen through the descriptor, leaving the option off: each connection inherits it, and their
    TIME_WAIT without it refuses the next start's bind)."""

    def listen(self, backlog: int = socket.SOMAXCONN) -> None:
        self.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a TIME_WAIT connection on the port allowed
        super().listen(backlog)


def bind(host: str, port: int) -> Listener:
    """A socket bound to ``host:port``, not yet listening (uvicorn listens on it once the supervisor is ready).
    Raises ListenError: the port held by another process (named), an address not this machine's, a port below
    1024 without the right."""
    listener = Listener(_family(host), socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no conflict
    try:
        listener.bind((host, port))
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)  # until the listen: see the module's doc
    except OSError as exc:
        listener.close()
        held = f": {holder(host, port)}" if exc.errno == errno.EADDRINUSE else ""
        raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}{held}") from None
    except BaseException:
        listener.close()
        raise
    return listener


def holder(host: str, port: int) -> str:
    """Who holds ``host:port`` (a socket on one of the addresses ``host`` names, or on a wildcard address), as the
    refusal names it; what stopped the search, if something did (it never raises: the refusal stays one line)."""
    try:
        named = socket.getaddrinfo(host, port, _family(host), socket.SOCK_STREAM) if host not in WILDCARDS else []
        addresses = {info[4][0] for info in named}
        connections = psutil.net_connections("tcp")
    except (psutil.Error, OSError) as exc:
        return f"who holds it cannot be found ({type(exc).__name__}: {one_line(str(exc))})"
    found = [
        connection
        for connection in connections
        if connection.laddr
        and connection.laddr.port == port
        and (connection.laddr.ip in WILDCARDS or host in WILDCARDS or connection.laddr.ip in addresses)
    ]
    found.sort(key=lambda connection: connection.status != psutil.CONN_LISTEN)  # a listener first
    for connection in found:
        if connection.pid is not None:
            return f"held by pid {connection.pid} ({_command(connection.pid)})"
    if found:  # /proc/<pid>/fd of another uid cannot be read without privilege
        return "held by a process this user cannot see (another user's: `ss -ltnp` as root names it)"
    return "no process found holding it"


def _family(host: str) -> socket.AddressFamily:
    """The family ``bind`` binds ``host`` in: an address with a colon is IPv6's, any other (a name too) IPv4's."""
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _command(pid: int) -> str:
    with contextlib.suppress(psutil.Error):
        process = psutil.Process(pid)
        command = shlex.join(process.cmdline()) or f"[{process.name()}]"
        shown = one_line(command)
        return shown if len(shown) <= MAX_COMMAND_CHARS else shown[: MAX_COMMAND_CHARS - 1] + "…"
    return "its command cannot be read"
