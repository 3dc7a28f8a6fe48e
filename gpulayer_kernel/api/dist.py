"""``GET /dist`` and ``GET /dist/{name}``: the wheel this control plane runs, for its workers.

Behind a join, instance or worker token (the credentials a machine being enrolled holds): the
wheel is no secret, but an open download would make the control plane a mirror for anyone.
``scripts/install-worker.sh`` and the SSH provider install from here by default, so a worker
always runs the version its control plane runs. Where the wheel comes from: ``selfwheel.py``.
"""

from __future__ import annotations

import asyncio
import os

from pydantic import Field

from ..contracts import Contract
from ..errors import NotFound
from ..selfwheel import DIST_ENV, Wheel, served_wheel
from .ops import op
from .worker_routes import JOINING, WorkerRoute

_lock = asyncio.Lock()  # one packing at a time; later callers find the cached file
_found: dict[str | None, Wheel] = {}  # by $GPULAYER_DIST, read per request (tests change it)


class DistInfo(Contract):
    """``GET /dist``: which wheel ``GET /dist/{name}`` serves."""

    version: str = Field(description="the gpulayer version the control plane runs")
    wheel: str = Field(description="the wheel's file name: GET /dist/{wheel}")
    sha256: str
    size: int = Field(description="bytes")


async def current_wheel() -> Wheel:
    """The served wheel, found (or packed, in a thread) on first use and kept."""
    key = os.environ.get(DIST_ENV)
    async with _lock:
        wheel = _found.get(key)
        if wheel is None or not wheel.path.is_file():
            wheel = _found[key] = await asyncio.to_thread(served_wheel)
        return wheel


class DistHandler(WorkerRoute):
    route = "/dist"

    @op(
        "the wheel this control plane runs: its file name, sha256 and size (install-worker.sh "
        "installs it)",
        answer=DistInfo,
        kinds=JOINING,
        errors=(404,),
    )
    async def get(self) -> DistInfo:
        wheel = await current_wheel()
        return DistInfo(
            version=self.ctx.version, wheel=wheel.name, sha256=wheel.sha256, size=wheel.size
        )


class DistFileHandler(WorkerRoute):
    route = "/dist/{name}"

    @op("the wheel itself (its name from GET /dist)", answer="bytes", kinds=JOINING, errors=(404,))
    async def get(self, name: str) -> bytes:
        wheel = await current_wheel()
        if name != wheel.name:
            raise NotFound(
                f"no file {name!r} here; this control plane serves {wheel.name}",
                hint="ask GET /api/v1/dist for the name",
                details={"name": name, "served": wheel.name},
                code="dist_not_found",
            )
        self.set_header("Content-Disposition", f'attachment; filename="{wheel.name}"')
        return await asyncio.to_thread(wheel.path.read_bytes)
