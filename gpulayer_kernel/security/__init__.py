"""Tokens, users and roles, secrets sealed at rest, and the TLS rule (ADR 0003, ADR 0009)."""

from __future__ import annotations

from .roles import (
    EMBEDDED,
    Identity,
    Role,
    can_act,
    can_read,
    check_act,
    check_read,
    check_role,
    check_user_name,
)
from .tls import CA_CERT_ENV, check_serve, check_url, client_verify, is_loopback, server_context
from .tokens import (
    KIND_LETTERS,
    Principal,
    TokenKind,
    TokenService,
    token_state,
)
from .ttl import parse_ttl
from .users import Limits, UserService, subject
from .vault import MEMORY_KEYS, KeySource, Vault, key_source

__all__ = [
    "CA_CERT_ENV",
    "EMBEDDED",
    "KIND_LETTERS",
    "MEMORY_KEYS",
    "Identity",
    "KeySource",
    "Limits",
    "Principal",
    "Role",
    "TokenKind",
    "TokenService",
    "UserService",
    "Vault",
    "can_act",
    "can_read",
    "check_act",
    "check_read",
    "check_role",
    "check_serve",
    "check_url",
    "check_user_name",
    "client_verify",
    "is_loopback",
    "key_source",
    "parse_ttl",
    "server_context",
    "subject",
    "token_state",
]
