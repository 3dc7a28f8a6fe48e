"""The Jupyter host's calls on a control plane's kernel relay: in-process, or over the network.

:class:`CpLink` calls a ControlPlane in this process: on this loop (the embedded default the
provisioner's host thread opened), or on the loop of the Jupyter server extension that hosts it
(``gpulayer lab``: one thread hop, no HTTP). :class:`HttpLink` calls a served one
(``GPULAYER_URL``, or the live owner of ``$GPULAYER_HOME``): the kernel's messages on one
WebSocket stream per kernel (``wire/stream.py``), the rest as HTTP calls on one kept-alive pool;
where the server or a proxy takes no WebSocket, the messages go over the HTTP ``frames`` routes.
Both offer the same calls, so the provisioner and its relay never care which they hold.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import httpx

from ..contracts import SessionInfo
from ..contracts.kernels import KernelConnection, KernelPage, KernelStart
from ..wire.kernels import KernelMessage, KernelStatus, LanePage, frames_body, from_frames
from ..wire.stream import Stream, StreamUnsupported

if TYPE_CHECKING:
    from ..controlplane import ControlPlane
    from ..security.roles import Identity

T = TypeVar("T")


class HostLink(Protocol):
    """What a kernel provisioner asks of the control plane."""

    async def start(self, req: KernelStart) -> SessionInfo: ...
    async def session(self, kernel_id: str) -> SessionInfo: ...
    async def explain(self, kernel_id: str) -> str: ...
    async def attach(self, kernel_id: str, conn: KernelConnection) -> SessionInfo: ...
    async def send(self, kernel_id: str, messages: list[KernelMessage]) -> None: ...
    async def receive(self, kernel_id: str, since: int, wait: float) -> LanePage: ...
    async def interrupt(self, kernel_id: str) -> None: ...
    async def restart(self, kernel_id: str, conn: KernelConnection) -> KernelStatus: ...
    async def stop(self, kernel_id: str, reason: str) -> None: ...
    def outage(self, kernel_id: str) -> float | None: ...
    async def close(self) -> None: ...


class CpLink:
    """Direct calls into a ControlPlane of this process, as ``who`` (default: its admin).

    ``loop``: the loop the control plane runs on, when it is not the caller's (the Jupyter
    server's, with the relays on their own thread): each call hops onto it and back.
    ``who`` is for a host acting for one user on a shared control plane (tests of quotas and
    roles; a served control plane learns the user from the token instead)."""

    def __init__(
        self,
        cp: ControlPlane,
        who: Identity | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.cp = cp
        self.relay = cp.kernels
        self.who = who
        self.loop = loop

    async def _on(self, coro: Coroutine[Any, Any, T]) -> T:
        if self.loop is None or self.loop is asyncio.get_running_loop():
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    async def start(self, req: KernelStart) -> SessionInfo:
        return await self._on(self.relay.start(req, self.who))

    async def session(self, kernel_id: str) -> SessionInfo:
        return await self._on(self.cp.get_session(kernel_id, who=self.who))

    async def explain(self, kernel_id: str) -> str:
        return await self._on(self.cp.explain(kernel_id, who=self.who))

    async def attach(self, kernel_id: str, conn: KernelConnection) -> SessionInfo:
        return await self._on(self.relay.attach(kernel_id, conn, self.who))

    async def send(self, kernel_id: str, messages: list[KernelMessage]) -> None:
        await self._on(self.relay.send(kernel_id, messages, self.who))

    async def receive(self, kernel_id: str, since: int, wait: float) -> LanePage:
        return await self._on(self.relay.receive(kernel_id, since, wait, self.who))

    async def interrupt(self, kernel_id: str) -> None:
        await self._on(self.relay.interrupt(kernel_id, self.who))

    async def restart(self, kernel_id: str, conn: KernelConnection) -> KernelStatus:
        return (await self._on(self.relay.restart(kernel_id, conn, self.who))).status

    async def stop(self, kernel_id: str, reason: str) -> None:
        await self._on(self.cp.stop_session(kernel_id, reason, who=self.who))

    def outage(self, kernel_id: str) -> float | None:
        return None  # the same process: never unreachable

    async def close(self) -> None:
        pass


class HttpLink:
    """The same calls on a served control plane's ``/api/v1`` with a client token.

    ``url`` may name several servers (``URL1,URL2``: an active and its standby): calls fail
    over as ``ha/failover.py`` says, past a hung leader within seconds (a frames long-poll keeps
    its own timeout)."""

    TIMEOUT = 60.0

    def __init__(self, url: str, token: str) -> None:
        from ..wire.http import Wire

        # GPUlayer's one HTTP client (wire/http.py): failover, pools, TLS, token, errors.
        self.wire = Wire(url, token or None, timeout=self.TIMEOUT)
        self.token = token
        self._streams: dict[str, Stream] = {}
        self._plain = False  # the server or a proxy takes no stream: the HTTP routes
        self.wire.pool()  # the first URL's now: a bad URL fails at once

    async def _call(
        self,
        method: str,
        path: str,
        body: str | None = None,
        params: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        from ..client.calls import Req

        pairs = list((params or {}).items())
        return await self.wire.send(Req(method, path, params=pairs, json=body, timeout=timeout))

    def _stream(self, kernel_id: str) -> Stream:
        s = self._streams.get(kernel_id)
        if s is None:
            s = self._streams[kernel_id] = Stream(
                self.wire.servers.urls, f"/kernels/{kernel_id}/stream", self.token
            )
        return s

    async def start(self, req: KernelStart) -> SessionInfo:
        resp = await self._call("POST", "/kernels", req.model_dump_json())
        return SessionInfo.model_validate_json(resp.content)

    async def session(self, kernel_id: str) -> SessionInfo:
        resp = await self._call("GET", f"/sessions/{kernel_id}")
        return SessionInfo.model_validate_json(resp.content)

    async def explain(self, kernel_id: str) -> str:
        resp = await self._call("GET", f"/jobs/{kernel_id}/explain")
        return str(resp.json().get("sentence", ""))

    async def attach(self, kernel_id: str, conn: KernelConnection) -> SessionInfo:
        resp = await self._call("POST", f"/kernels/{kernel_id}/attach", conn.model_dump_json())
        return SessionInfo.model_validate_json(resp.content)

    async def send(self, kernel_id: str, messages: list[KernelMessage]) -> None:
        if not self._plain:
            try:
                await self._stream(kernel_id).send(messages)
                return
            except StreamUnsupported:
                self._plain = True
        await self._call("POST", f"/kernels/{kernel_id}/frames", frames_body(messages))

    async def receive(self, kernel_id: str, since: int, wait: float) -> LanePage:
        if not self._plain:
            stream = self._stream(kernel_id)
            try:
                found = await stream.receive(since, wait)
            except StreamUnsupported:
                self._plain = True
            else:
                status = stream.status
                page = LanePage(
                    [m for _, m in found],
                    found[-1][0] if found else since,
                    KernelStatus(
                        status.get("state", "waiting"),
                        int(status.get("generation", 0)),
                        status.get("reason"),
                        bool(status.get("final", False)),
                    ),
                )
                return page
        params = {"since": str(since), "wait": str(wait)}
        resp = await self._call("GET", f"/kernels/{kernel_id}/frames", None, params, wait + 30)
        return _lane_page(KernelPage.model_validate_json(resp.content))

    async def interrupt(self, kernel_id: str) -> None:
        await self._call("POST", f"/kernels/{kernel_id}/interrupt")

    async def restart(self, kernel_id: str, conn: KernelConnection) -> KernelStatus:
        resp = await self._call("POST", f"/kernels/{kernel_id}/restart", conn.model_dump_json())
        return _lane_page(KernelPage.model_validate_json(resp.content)).status

    async def stop(self, kernel_id: str, reason: str) -> None:
        await self._call("POST", f"/sessions/{kernel_id}/stop", params={"reason": reason})

    def outage(self, kernel_id: str) -> float | None:
        s = self._streams.get(kernel_id)
        return None if s is None else s.down_since

    async def close(self) -> None:
        for s in self._streams.values():
            await s.close()
        self._streams.clear()
        await self.wire.aclose()


def _lane_page(page: KernelPage) -> LanePage:
    return LanePage(
        from_frames(page.frames),
        page.next_since,
        KernelStatus(page.state, page.generation, page.reason, page.final),
    )
