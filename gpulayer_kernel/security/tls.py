"""The TLS rule (ADR 0009): plain HTTP only on loopback, HTTPS (with a certificate) everywhere else.

``gpulayer serve`` refuses to bind a non-loopback address without ``--tls-cert``/``--tls-key``; the
client and the worker refuse an ``http://`` URL whose host is not loopback (127.0.0.0/8, ::1,
``localhost``). A private CA is trusted with ``--ca-cert`` or ``GPULAYER_CA_CERT``.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import ssl
from urllib.parse import urlsplit

from ..errors import InvalidInput

CA_CERT_ENV = "GPULAYER_CA_CERT"


def is_loopback(host: str) -> bool:
    """True for ``localhost``, 127.0.0.0/8 and ::1 (brackets allowed)."""
    h = host.strip().strip("[]").lower()
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def check_serve(host: str, cert: str | None, key: str | None) -> None:
    """Refuse plain HTTP on a non-loopback address (and a certificate without its key)."""
    if bool(cert) != bool(key):
        raise InvalidInput(
            "--tls-cert and --tls-key go together",
            hint="pass both the certificate (PEM) and its private key (PEM)",
            code="tls_incomplete",
        )
    if cert or is_loopback(host):
        return
    raise InvalidInput(
        f"refusing to serve plain HTTP on {host}: tokens would cross the network in clear text",
        hint="pass --tls-cert CERT.pem --tls-key KEY.pem (a private CA works: give clients and "
        "workers --ca-cert), or bind --host 127.0.0.1 and reach it through an SSH tunnel",
        details={"host": host},
        code="tls_required",
    )


def check_url(url: str, what: str = "the control plane") -> None:
    """Refuse an ``http://`` URL to a non-loopback host; only http and https are accepted."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput(
            f"{url!r} is not an http(s) URL of {what}",
            hint="write it as https://host:8470 (or http://127.0.0.1:8470 on this machine)",
            details={"url": url},
            code="bad_url",
        )
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        raise InvalidInput(
            f"refusing plain http:// to {parts.hostname}: the token would cross the network "
            "in clear text",
            hint=f"use https://{parts.netloc}{parts.path} (serve with --tls-cert/--tls-key; for a "
            f"private CA pass --ca-cert or set {CA_CERT_ENV}), or tunnel to 127.0.0.1",
            details={"url": url},
            code="tls_required",
        )


def server_context(cert: str, key: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidInput(
            f"cannot load the TLS certificate {cert} with key {key}: {exc}",
            hint="both files must be PEM; the key must belong to the certificate",
            code="tls_invalid",
        ) from None
    return ctx


def client_verify(ca_cert: str | None = None) -> ssl.SSLContext:
    """How a client or worker checks the server: the system CAs, or a private CA's file.

    Contexts are made once per CA file and shared: loading the system CAs costs ~40 ms.
    """
    return _context(ca_cert or os.environ.get(CA_CERT_ENV) or None)


@functools.lru_cache(maxsize=16)
def _context(ca_cert: str | None) -> ssl.SSLContext:
    try:
        return ssl.create_default_context(cafile=ca_cert)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidInput(
            f"cannot load the CA certificate {ca_cert}: {exc}",
            hint=f"--ca-cert / {CA_CERT_ENV} must name a PEM file",
            code="tls_invalid",
        ) from None
