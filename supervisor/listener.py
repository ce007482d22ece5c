"""The listening address, taken before anything else starts: ``serve`` binds it first (a port in use is one
line, with no journal locked and no child started), ``doctor`` tries it and lets it go."""

from __future__ import annotations

import socket


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port``, not yet listening (uvicorn listens on it once the supervisor is ready).
    Raises OSError: the port in use, an address not this machine's, a port below 1024 without the right."""
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no conflict
    try:
        listener.bind((host, port))
    except BaseException:
        listener.close()
        raise
    return listener
