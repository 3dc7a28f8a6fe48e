"""Stores behind interfaces (ADR 0008): metadata in SQLite or PostgreSQL, blobs content-addressed.

``open_store(url)`` opens a metadata store by URL; every ``MetadataStore`` passes the conformance
suite in ``tests/store/conformance.py``.
"""

from __future__ import annotations

from .artifacts import ArtifactStore, LocalArtifactStore, MemoryArtifactStore
from .base import (
    AuditEntry,
    AuditQuery,
    IdempotencyRecord,
    JobQuery,
    MetadataStore,
    QuotaRecord,
    SecretRecord,
    TokenRecord,
    UserRecord,
)
from .factory import open_store
from .sqlite import LATEST_SCHEMA, SqliteStore

__all__ = [
    "LATEST_SCHEMA",
    "ArtifactStore",
    "AuditEntry",
    "AuditQuery",
    "IdempotencyRecord",
    "JobQuery",
    "LocalArtifactStore",
    "MemoryArtifactStore",
    "MetadataStore",
    "QuotaRecord",
    "SecretRecord",
    "SqliteStore",
    "TokenRecord",
    "UserRecord",
    "open_store",
]
