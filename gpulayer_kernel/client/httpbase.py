"""What both HTTP sides of GPUlayer share: the client (``clients.py``, ``calls.py``) and the
worker's transport (``worker/http.py``).

An httpx client with the TLS rule applied (a loopback ``gpulayer serve``'s own CA found beside
its address) and kept-alive connections; the error a refused answer stands for, rebuilt as the
same exception type an in-process call raises; the error of a server that cannot be reached.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import httpx

from ..errors import GPUlayerError, Unavailable, from_json
from ..ha.failover import LEADER_HEADER, ROLE_HEADER
from ..home import Layout, home_dir, read_owner
from ..security.tls import CA_CERT_ENV, check_url, client_verify, is_loopback

__all__ = ["API", "api_base", "error_from", "http_client", "unreachable"]

API = "/api/v1"


def api_base(url: str) -> str:
    """``http://host:8470`` → ``http://host:8470/api/v1`` (an URL already ending so is kept)."""
    url = url.rstrip("/")
    return url if url.endswith(API) else url + API


def _owner_ca(url: str) -> str | None:
    """The CA file a local ``gpulayer serve`` published beside its address, if this is it."""
    try:
        owner = read_owner(Layout(home_dir()))
    except OSError:
        return None
    if owner.get("url") and api_base(str(owner["url"])) == api_base(url):
        ca = owner.get("ca_cert")
        return str(ca) if ca else None
    return None


def http_client(
    url: str,
    *,
    ca_cert: str | None,
    timeout: float,
    asynchronous: bool,
    headers: dict[str, str] | None = None,
) -> httpx.AsyncClient | httpx.Client:
    """An httpx client with the TLS rule applied and kept-alive connections."""
    check_url(url)
    parts = urlsplit(url)
    if parts.scheme == "https" and ca_cert is None and parts.hostname:
        if is_loopback(parts.hostname):
            ca_cert = _owner_ca(url)
    # A shared context even for http:// (httpx builds one per client otherwise: ~40 ms each).
    verify = client_verify(ca_cert)
    kwargs: dict[str, Any] = {
        "base_url": api_base(url),
        "verify": verify,
        "timeout": httpx.Timeout(timeout, connect=min(timeout, 10.0)),
        # Connections are kept and reused (a new one costs ~30 ms, a reused one < 1 ms). A client
        # opens one per concurrent call (a long-poll plus a cancel; a worker's jobs reporting at
        # once) and keeps each: closing extras after use would reconnect on every burst.
        "limits": httpx.Limits(max_keepalive_connections=16, max_connections=16),
        "headers": headers or {},
        "trust_env": False,  # never send the token through an environment-configured proxy
    }
    return httpx.AsyncClient(**kwargs) if asynchronous else httpx.Client(**kwargs)


def unreachable(url: str, exc: Exception) -> Unavailable:
    text = str(exc) or type(exc).__name__
    hint = "is `gpulayer serve` running there? check GPULAYER_URL"
    if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
        hint = (
            f"the server's certificate is not trusted: pass --ca-cert or set {CA_CERT_ENV} "
            "to the CA that signed it"
        )
    return Unavailable(
        f"cannot reach the control plane at {url}: {text}",
        hint=hint,
        details={"url": url},
        code="server_unreachable",
    )


def error_from(resp: httpx.Response) -> GPUlayerError:
    """Rebuild the server's error, so callers see the same exception type as in-process."""
    try:
        body = resp.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and "code" in body:
        return from_json(resp.status_code, body)
    if resp.status_code == 503 and resp.headers.get(ROLE_HEADER) == "standby":
        # A standby's answer to HEAD has no body to say so: its header does.
        leader = resp.headers.get(LEADER_HEADER)
        return from_json(
            503,
            {
                "code": "not_leader",
                "message": "this control plane is a standby"
                + (f"; the leader is {leader}" if leader else ""),
                "hint": "give every URL of the cluster (GPULAYER_URL=URL1,URL2)",
                "details": {"leader": leader},
            },
        )
    text = resp.text[:300] if resp.request.method != "HEAD" else ""
    return from_json(
        resp.status_code,
        {"code": f"http_{resp.status_code}", "message": f"HTTP {resp.status_code} {text}".strip()},
    )
