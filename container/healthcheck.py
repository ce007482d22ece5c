#!/usr/bin/env python3
"""Container health probe: GET /health on loopback with the bearer token; exit 0 when the supervisor is ready.

Installed in the image as /usr/local/bin/crew-supervisor-healthcheck and used by the image's HEALTHCHECK, by
compose and by the Kubernetes exec probes. Every route needs the bearer token, /health included; an httpGet probe
could only send it by writing it into the manifest, so this reads it from the file the supervisor reads.
Standard library only, so it starts in milliseconds. It never prints the token.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request

MAX_TOKEN_BYTES = 16384 + 2  # the supervisor's own limit, plus a line end


def target() -> str:
    host = os.environ.get("AIP_CREWAI_HOST", "127.0.0.1").strip()
    if host in ("", "0.0.0.0", "::"):  # a wildcard listener is reachable on loopback
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{os.environ.get('AIP_CREWAI_PORT', '8090').strip()}/health"


def token() -> str:
    path = os.environ.get("AIP_CREWAI_BEARER_TOKEN_FILE", "").strip()
    if not path:
        return os.environ.get("AIP_CREWAI_BEARER_TOKEN", "").strip()
    with open(path, "rb") as file:
        return next(iter(file.read(MAX_TOKEN_BYTES).decode().split()), "")  # a file may hold several, one a line


def main() -> int:
    try:
        secret = token()
        request = urllib.request.Request(target(), headers={"Authorization": f"Bearer {secret}"} if secret else {})
        # No proxies: an HTTP_PROXY in the container's environment must not route a loopback probe elsewhere.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(request, timeout=float(os.environ.get("CREW_SUPERVISOR_HEALTH_TIMEOUT", "4"))) as response:
            status = json.load(response).get("status")
    except urllib.error.HTTPError as exc:
        print(f"unhealthy: HTTP {exc.code}", file=sys.stderr)
        return 1
    except (OSError, ValueError, AttributeError) as exc:
        print(f"unhealthy: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if status != "ready":
        print(f"unhealthy: status {status!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
