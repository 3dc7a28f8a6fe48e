"""The Jupyter host's calls on a control plane's kernel relay: in-process or over HTTP.

:class:`CpLink` calls a ControlPlane on the same loop (the embedded default: the provisioner's
host thread opened it); :class:`HttpLink` calls a served one (``GPULAYER_URL``, or the live owner
of ``$GPULAYER_HOME``, such as the Jupyter server extension), with one kept-alive connection pool.
Both offer the same calls, so the provisioner and its relay never care which they hold.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import httpx

from ..contracts import SessionInfo
from ..contracts.kernels import KernelConnection, KernelFrame, KernelPage, KernelStart

if TYPE_CHECKING:
    from ..controlplane import ControlPlane
    from ..security.roles import Identity


class HostLink(Protocol):
    """What a kernel provisioner asks of the control plane."""

    async def start(self, req: KernelStart) -> SessionInfo: ...
    async def session(self, kernel_id: str) -> SessionInfo: ...
    async def explain(self, kernel_id: str) -> str: ...
    async def attach(self, kernel_id: str, conn: KernelConnection) -> SessionInfo: ...
    async def send(self, kernel_id: str, frames: list[KernelFrame]) -> None: ...
    async def receive(self, kernel_id: str, since: int, wait: float) -> KernelPage: ...
    async def interrupt(self, kernel_id: str) -> None: ...
    async def restart(self, kernel_id: str, conn: KernelConnection) -> KernelPage: ...
    async def stop(self, kernel_id: str, reason: str) -> None: ...
    async def close(self) -> None: ...


class CpLink:
    """Direct calls into a ControlPlane on this loop, as ``who`` (default: its embedded admin).

    ``who`` is for a host acting for one user on a shared control plane (tests of quotas and
    roles; a served control plane learns the user from the token instead)."""

    def __init__(self, cp: ControlPlane, who: Identity | None = None) -> None:
        from ..controlplane.sessions.kernels import relay_for

        self.cp = cp
        self.relay = relay_for(cp)
        self.who = who

    async def start(self, req: KernelStart) -> SessionInfo:
        return await self.relay.start(req, self.who)

    async def session(self, kernel_id: str) -> SessionInfo:
        return await self.cp.get_session(kernel_id, who=self.who)

    async def explain(self, kernel_id: str) -> str:
        return await self.cp.explain(kernel_id, who=self.who)

    async def attach(self, kernel_id: str, conn: KernelConnection) -> SessionInfo:
        return await self.relay.attach(kernel_id, conn, self.who)

    async def send(self, kernel_id: str, frames: list[KernelFrame]) -> None:
        await self.relay.send(kernel_id, frames, self.who)

    async def receive(self, kernel_id: str, since: int, wait: float) -> KernelPage:
        return await self.relay.receive(kernel_id, since, wait, self.who)

    async def interrupt(self, kernel_id: str) -> None:
        await self.relay.interrupt(kernel_id, self.who)

    async def restart(self, kernel_id: str, conn: KernelConnection) -> KernelPage:
        return await self.relay.restart(kernel_id, conn, self.who)

    async def stop(self, kernel_id: str, reason: str) -> None:
        await self.cp.stop_session(kernel_id, reason, who=self.who)

    async def close(self) -> None:
        pass


class HttpLink:
    """The same calls on a served control plane's ``/api/v1`` with a client token.

    ``url`` may name several servers (``URL1,URL2``: an active and its standby): calls fail
    over as ``ha/failover.py`` says, past a hung leader within seconds (a frames long-poll keeps
    its own timeout)."""

    TIMEOUT = 60.0

    def __init__(self, url: str, token: str) -> None:
        from ..ha.failover import Servers

        self.servers = Servers(url)
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._https: dict[str, httpx.AsyncClient] = {}
        self._pool()  # the first URL's now: a bad URL fails at once

    @property
    def http(self) -> httpx.AsyncClient:
        """The connection pool of the URL in use."""
        return self._pool()

    def _pool(self) -> httpx.AsyncClient:
        from ..client.httpbase import http_client

        url = self.servers.url
        if url not in self._https:
            client = http_client(url, ca_cert=None, timeout=self.TIMEOUT, asynchronous=True)
            assert isinstance(client, httpx.AsyncClient)
            self._https[url] = client
        return self._https[url]

    async def _call(
        self,
        method: str,
        path: str,
        body: str | None = None,
        params: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        from ..client.httpbase import error_from, unreachable
        from ..ha.failover import send

        headers = dict(self.headers)
        if body is not None:
            headers["Content-Type"] = "application/json"
        outcome = await send(
            self.servers,
            self._pool,
            method,
            path.lstrip("/"),
            default=self.TIMEOUT,
            own=timeout,
            content=body.encode() if body is not None else None,
            params=params,
            headers=headers,
        )
        if isinstance(outcome, httpx.TransportError):
            raise unreachable(self.servers.url, outcome) from None
        if outcome.status_code >= 400:
            raise error_from(outcome)
        return outcome

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

    async def send(self, kernel_id: str, frames: list[KernelFrame]) -> None:
        body = '{"frames":[' + ",".join(f.model_dump_json() for f in frames) + "]}"
        await self._call("POST", f"/kernels/{kernel_id}/frames", body)

    async def receive(self, kernel_id: str, since: int, wait: float) -> KernelPage:
        params = {"since": str(since), "wait": str(wait)}
        resp = await self._call("GET", f"/kernels/{kernel_id}/frames", None, params, wait + 30)
        return KernelPage.model_validate_json(resp.content)

    async def interrupt(self, kernel_id: str) -> None:
        await self._call("POST", f"/kernels/{kernel_id}/interrupt")

    async def restart(self, kernel_id: str, conn: KernelConnection) -> KernelPage:
        resp = await self._call("POST", f"/kernels/{kernel_id}/restart", conn.model_dump_json())
        return KernelPage.model_validate_json(resp.content)

    async def stop(self, kernel_id: str, reason: str) -> None:
        await self._call("POST", f"/sessions/{kernel_id}/stop", params={"reason": reason})

    async def close(self) -> None:
        for http in self._https.values():
            await http.aclose()
