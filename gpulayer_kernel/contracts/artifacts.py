"""Artifact contract: a file kept by the control plane, named by its content."""

from __future__ import annotations

from pydantic import Field

from ._base import SHA256_PATTERN, Contract


class Artifact(Contract):
    digest: str = Field(pattern=SHA256_PATTERN)
    size: int = Field(ge=0)
    name: str = Field(min_length=1, max_length=500)
    rank: int | None = None
