#!/usr/bin/env python3
"""The control-plane image's HEALTHCHECK: exit 0 when ``GET /api/v1/health`` answers ok (or
degraded: a standby that is alive but says what would stop it taking over).

It asks the server in this container over loopback, so it needs no token (the route takes none)
and no certificate check: with TLS on, the certificate names the public host, not 127.0.0.1,
and nothing secret travels. Exit 1 with one line saying why otherwise (``docker inspect`` shows
it). Standard library only: the slim image has no curl.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import urllib.request


def main() -> int:
    tls = bool(os.environ.get("GPULAYER_TLS_CERT"))
    port = os.environ.get("GPULAYER_PORT", "8470")
    url = f"{'https' if tls else 'http'}://127.0.0.1:{port}/api/v1/health"
    context = ssl._create_unverified_context() if tls else None  # loopback; see the docstring
    try:
        with urllib.request.urlopen(url, timeout=4, context=context) as answer:
            health = json.load(answer)
    except Exception as exc:  # any failure is "unhealthy", said in one line
        print(f"unhealthy: {url}: {exc}")
        return 1
    if health.get("status") not in ("ok", "degraded"):
        print(f"unhealthy: {url}: {health}")
        return 1
    # A degraded standby is alive (a restart would not fix its key): healthy, with the problem.
    problem = (health.get("problem") or {}).get("message")
    print(f"healthy: gpulayer {health.get('version')}" + (f"; {problem}" if problem else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
