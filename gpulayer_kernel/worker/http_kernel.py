"""A GPU kernel's relay from a worker over the network (ADR 0021): the worker's kernel routes.

The key to start the kernel with (``GET /worker/jobs/{id}/kernel/connection``) and its process's
exit (``POST …/kernel/exit``) are plain requests on the worker transport's wire (its session
token, failover, TLS, errors); the kernel's messages go both ways on one stream
(``…/kernel/stream``, ``wire/stream.py``), or on the ``frames`` routes where a proxy takes no
WebSocket.
"""

from __future__ import annotations

from ..client.calls import Req
from ..contracts.kernels import KernelConnection, KernelExit, KernelPage
from ..errors import NotFound
from ..wire.http import Wire
from ..wire.kernels import KernelMessage, KernelStatus, LanePage, frames_body, from_frames
from ..wire.stream import Stream, StreamUnsupported


class HttpKernelLink:
    """One kernel executor's link, on its worker transport's wire (URLs, session token, TLS)."""

    def __init__(self, wire: Wire) -> None:
        self.wire = wire
        self._stream: Stream | None = None
        self._plain = False  # the server or a proxy takes no stream: the HTTP routes

    def _on(self, job_id: str) -> Stream:
        if self._stream is None:
            self._stream = Stream(
                self.wire.servers.urls,
                f"/worker/jobs/{job_id}/kernel/stream",
                self._token,
                ca_cert=self.wire.ca_cert,
            )
        return self._stream

    def _token(self) -> str:
        c = self.wire.credential
        return (c() if callable(c) else c) or ""

    async def connection(self, job_id: str, wait: float) -> KernelConnection | None:
        path = f"/worker/jobs/{job_id}/kernel/connection"
        req = Req("GET", path, params=[("wait", str(wait))], timeout=wait + 30)
        try:
            resp = await self.wire.send(req)
        except NotFound:
            return None
        return KernelConnection.model_validate_json(resp.content)

    async def receive(self, job_id: str, since: int, wait: float) -> LanePage:
        if not self._plain:
            try:
                found = await self._on(job_id).receive(since, wait)
                last = found[-1][0] if found else since
                return LanePage([m for _, m in found], last, KernelStatus("up", 0))
            except StreamUnsupported:
                self._plain = True
        params = [("since", str(since)), ("wait", str(wait))]
        req = Req("GET", f"/worker/jobs/{job_id}/kernel/frames", params=params, timeout=wait + 30)
        page = KernelPage.model_validate_json((await self.wire.send(req)).content)
        status = KernelStatus(page.state, page.generation, page.reason)
        return LanePage(from_frames(page.frames), page.next_since, status)

    async def send(self, job_id: str, messages: list[KernelMessage]) -> None:
        if not self._plain:
            try:
                await self._on(job_id).send(messages)
                return
            except StreamUnsupported:
                self._plain = True
        path = f"/worker/jobs/{job_id}/kernel/frames"
        await self.wire.send(Req("POST", path, json=frames_body(messages)))

    async def exited(self, job_id: str, report: KernelExit) -> None:
        path = f"/worker/jobs/{job_id}/kernel/exit"
        await self.wire.send(Req("POST", path, json=report.model_dump_json()))

    async def close(self) -> None:
        if self._stream is not None:
            await self._stream.close()
