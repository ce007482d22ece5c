"""TLS contexts parsed before the fork, so a job's HTTP clients do not each parse the CA bundle again.

httpx builds an ``ssl.SSLContext`` for every client, even for an ``http://`` URL, and CrewAI's native
providers build two clients per ``LLM`` (the openai SDK's sync and async ones): each parses certifi's
bundle (``load_verify_locations``, 31-48 ms of CPU here) — 95 % of what building an ``LLM`` costs. The fork
server builds a few contexts exactly as httpx would in its environment (from ``SSL_CERT_FILE``, else
certifi's bundle), before it forks; ``ssl.create_default_context`` in a worker then hands out one of them,
never used before and never given twice, when it is asked for exactly that (server authentication, that
file, no other source), the file is unchanged since, and the job's environment does not ask for a TLS key
log. Anything else (another ``SSL_CERT_FILE`` in the job's environment, a ``verify=`` of the crew's own, an
empty pool) is built afresh, as without this module: each job's TLS settings stay its own. With only
``SSL_CERT_DIR`` set there is nothing to pool: OpenSSL reads that directory lazily, at a handshake.
"""

from __future__ import annotations

import os
import ssl
from typing import Any

POOL = 8  # four LLMs' worth of clients: a crew that builds more pays for the rest itself
_original = ssl.create_default_context  # the standard library's, as imported: what every context not pooled is


class Pool:
    """Contexts parsed from ``cafile`` (whose identity they were parsed at is ``source``), each handed out once by
    ``context``, which stands in for ``ssl.create_default_context`` once ``prepare`` installed it."""

    def __init__(self, cafile: str, size: int) -> None:
        self._source = (cafile, _identity(cafile))
        self._contexts = [_original(cafile=cafile) for _ in range(size)]

    def __len__(self) -> int:
        return len(self._contexts)

    def context(
        self, purpose: Any = ssl.Purpose.SERVER_AUTH, *, cafile: Any = None, capath: Any = None, cadata: Any = None
    ) -> ssl.SSLContext:
        if (
            self._contexts
            and purpose == ssl.Purpose.SERVER_AUTH
            and cafile == self._source[0]
            and capath is None
            and cadata is None
            and not os.environ.get("SSLKEYLOGFILE")  # create_default_context would set the context's key log
            and _identity(cafile) == self._source[1]
        ):
            return self._contexts.pop()
        return _original(purpose, cafile=cafile, capath=capath, cadata=cadata)


def prepare(size: int = POOL) -> Pool | None:
    """Build ``size`` contexts from the file httpx would load here and take over ``ssl.create_default_context``
    with them; None: nothing to pool."""
    cafile = os.environ.get("SSL_CERT_FILE") or (None if os.environ.get("SSL_CERT_DIR") else _certifi())
    if cafile is None:
        return None
    pool = Pool(cafile, size)
    ssl.create_default_context = pool.context  # httpx calls it with no way to hand it the pool
    return pool


def _certifi() -> str | None:
    try:
        import certifi
    except ImportError:
        return None
    return str(certifi.where())


def _identity(path: str) -> tuple[int, int, int, int]:
    try:
        status = os.stat(path)
    except OSError:
        return (0, 0, 0, 0)
    return (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns)
