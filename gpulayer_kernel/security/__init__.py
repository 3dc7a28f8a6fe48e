"""Tokens and the TLS rule (ADR 0003, ADR 0009)."""

from __future__ import annotations

from .tls import CA_CERT_ENV, check_serve, check_url, client_verify, is_loopback, server_context
from .tokens import (
    KIND_LETTERS,
    Principal,
    TokenKind,
    TokenService,
    parse_ttl,
    token_state,
)

__all__ = [
    "CA_CERT_ENV",
    "KIND_LETTERS",
    "Principal",
    "TokenKind",
    "TokenService",
    "check_serve",
    "check_url",
    "client_verify",
    "is_loopback",
    "parse_ttl",
    "server_context",
    "token_state",
]
