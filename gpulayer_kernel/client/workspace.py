"""The Jupyter host's workspace calls (ADR 0022), written once per way of reaching the plane.

:class:`CpWorkspaceLink` calls a ControlPlane in this process; :class:`HttpWorkspaceLink` a served
one over ``/api/v1`` (the kernels' kept-alive pool, or a client of its own). ``link_for`` makes
the right one from a GPU kernel's host link or from a ``connect`` session, so the provisioner,
the ``%%gpulayer`` magic and ``gpulayer pull`` never care which they hold.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx

from ..codes import ErrorCode
from ..contracts.workspace import Digests, WorkspaceAnswer, WorkspaceCall, WorkspaceView
from ..errors import NotFound

if TYPE_CHECKING:
    from ..controlplane import ControlPlane
    from ..security.roles import Identity
    from ..wire.http import Wire
    from ..workspace.host import WorkspaceLink


class CpWorkspaceLink:
    """Direct calls into a ControlPlane on this loop, as ``who``."""

    def __init__(self, cp: ControlPlane, who: Identity | None = None) -> None:
        self.plane = cp.workspace
        self.who = who

    async def view(self, session_id: str) -> WorkspaceView | None:
        return await self.plane.view(session_id, self.who)

    async def missing(self, digests: list[str]) -> list[str]:
        return await self.plane.missing(digests, self.who)

    async def put_pack(self, blob: bytes) -> None:
        from ..security.roles import resolved

        await self.plane.put_pack(blob, resolved(self.who).user)

    async def read_pack(self, digests: list[str]) -> bytes:
        from ..security.roles import resolved

        return await self.plane.read_pack(digests, resolved(self.who).user)

    async def call(self, session_id: str, call: WorkspaceCall, wait: float) -> WorkspaceAnswer:
        return await self.plane.call(session_id, call, wait, self.who)


class HttpWorkspaceLink:
    """The same calls on a served control plane, on its caller's wire (``wire/http.py``: the
    kernels' link's, or a client's: failover, pools, TLS, token, errors)."""

    def __init__(self, wire: Wire) -> None:
        self.wire = wire

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: str | None = None,
        content: bytes | None = None,
        params: dict[str, str] | None = None,
        timeout: float = 120.0,
    ) -> httpx.Response:
        from .calls import Req

        pairs = list((params or {}).items())
        req = Req(method, path, params=pairs, json=body, content=content, timeout=timeout)
        return await self.wire.send(req)

    async def view(self, session_id: str) -> WorkspaceView | None:
        try:
            resp = await self._call("GET", f"/sessions/{session_id}/workspace")
        except NotFound as exc:
            if exc.code == ErrorCode.WORKSPACE_NONE:
                return None
            raise
        return WorkspaceView.model_validate_json(resp.content)

    async def missing(self, digests: list[str]) -> list[str]:
        body = Digests(digests=digests).model_dump_json()
        resp = await self._call("POST", "/workspace/missing", body=body)
        return list(Digests.model_validate_json(resp.content).digests)

    async def put_pack(self, blob: bytes) -> None:
        await self._call("POST", "/workspace/objects", content=blob, timeout=600.0)

    async def read_pack(self, digests: list[str]) -> bytes:
        body = Digests(digests=digests).model_dump_json()
        resp = await self._call("POST", "/workspace/objects/read", body=body, timeout=600.0)
        return resp.content

    async def call(self, session_id: str, call: WorkspaceCall, wait: float) -> WorkspaceAnswer:
        resp = await self._call(
            "POST",
            f"/sessions/{session_id}/workspace/calls",
            body=call.model_dump_json(),
            params={"wait": str(wait)},
            timeout=wait + 30,
        )
        return WorkspaceAnswer.model_validate_json(resp.content)


def link_for(source: Any) -> WorkspaceLink:
    """The workspace link beside a kernel's host link (``kernels/link.py``) or a control plane
    session from ``client.connect`` (a ControlPlane, or an ``AsyncClient``)."""
    from ..wire.http import Wire

    cp = getattr(source, "cp", None)
    if cp is not None:
        return CpWorkspaceLink(cp, getattr(source, "who", None))
    wire = getattr(source, "wire", None)
    if isinstance(wire, Wire):
        return HttpWorkspaceLink(wire)
    from ..controlplane import ControlPlane

    if isinstance(source, ControlPlane):
        return CpWorkspaceLink(source)
    raise TypeError(f"no workspace link for {type(source).__name__}")
