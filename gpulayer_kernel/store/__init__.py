"""Stores behind interfaces (ADR 0008): metadata in SQLite, blobs in a content-addressed store."""

from __future__ import annotations

from .artifacts import ArtifactStore, LocalArtifactStore, MemoryArtifactStore
from .base import JobQuery, MetadataStore, TokenRecord
from .sqlite import LATEST_SCHEMA, SqliteStore

__all__ = [
    "LATEST_SCHEMA",
    "ArtifactStore",
    "JobQuery",
    "LocalArtifactStore",
    "MemoryArtifactStore",
    "MetadataStore",
    "SqliteStore",
    "TokenRecord",
]
