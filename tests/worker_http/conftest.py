"""A real API server in this loop, for the worker's HTTP transport and its tunnel."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ..api.conftest import Api, running_api


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(tmp_path, heartbeat_timeout=5.0) as a:
        yield a
