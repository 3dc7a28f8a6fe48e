"""The client calls of notebook sessions, for both clients (ADR 0019).

As in ``calls.py``, each call is written once as a generator of requests; ``AsyncSessionCalls``
and ``SessionCallsSync`` are the two clients' methods over them (``clients.py`` mixes them in),
the same names and answers as the ControlPlane's own.
"""

from __future__ import annotations

import builtins
import time
from typing import TYPE_CHECKING, TypeVar

from ..contracts import (
    CellList,
    CellPage,
    CellRequest,
    CellRun,
    SessionHolder,
    SessionInfo,
    SessionList,
    SessionSpec,
)
from .calls import POLL_CHUNK, POLL_SLACK, Call, Req, _body, _model, _pid, new_key

T = TypeVar("T")


class SessionCalls:
    def start_session(self, spec: SessionSpec, key: str | None = None) -> Call[SessionInfo]:
        req = Req("POST", "/sessions", json=_body(spec), key=new_key(key))
        return _model(SessionInfo, (yield req))

    def list_sessions(self, *, include_ended: bool = False) -> Call[builtins.list[SessionInfo]]:
        params = [("all", "1" if include_ended else "0")]
        return _model(SessionList, (yield Req("GET", "/sessions", params=params))).sessions

    def get_session(self, ref: str) -> Call[SessionInfo]:
        return _model(SessionInfo, (yield Req("GET", f"/sessions/{_pid(ref)}")))

    def run_cell(
        self, ref: str, request: CellRequest, wait: float = 0.0, key: str | None = None
    ) -> Call[CellPage]:
        # One request: a short cell's output and end come back in its answer. A longer one is
        # followed with ``follow_cell`` (the caller decides how, to show output as it comes).
        chunk = min(max(0.0, wait), POLL_CHUNK)
        return _model(
            CellPage,
            (
                yield Req(
                    "POST",
                    f"/sessions/{_pid(ref)}/cells",
                    params=[("wait", f"{chunk:.3f}")],
                    json=_body(request),
                    timeout=chunk + POLL_SLACK,
                    key=new_key(key),
                )
            ),
        )

    def follow_cell(
        self, ref: str, number: int, since: int = 0, wait: float = 0.0
    ) -> Call[CellPage]:
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            chunk = min(max(0.0, deadline - time.monotonic()), POLL_CHUNK)
            page = _model(
                CellPage,
                (
                    yield Req(
                        "GET",
                        f"/sessions/{_pid(ref)}/cells/{int(number)}",
                        params=[("since", str(since)), ("wait", f"{chunk:.3f}")],
                        timeout=chunk + POLL_SLACK,
                    )
                ),
            )
            if page.records or page.finished or time.monotonic() >= deadline:
                return page
            since = page.next_since

    def session_cells(self, ref: str, limit: int = 100) -> Call[builtins.list[CellRun]]:
        path = f"/sessions/{_pid(ref)}/cells"
        return _model(CellList, (yield Req("GET", path, params=[("limit", str(limit))]))).cells

    def _session_post(self, ref: str, action: str) -> Call[SessionInfo]:
        return _model(SessionInfo, (yield Req("POST", f"/sessions/{_pid(ref)}/{action}")))

    def interrupt_session(self, ref: str) -> Call[SessionInfo]:
        return self._session_post(ref, "interrupt")

    def restart_session(self, ref: str) -> Call[SessionInfo]:
        return self._session_post(ref, "restart")

    def stop_session(self, ref: str, reason: str = "stopped by the user") -> Call[SessionInfo]:
        path = f"/sessions/{_pid(ref)}/stop"
        return _model(SessionInfo, (yield Req("POST", path, params=[("reason", reason)])))

    def attach_session(self, ref: str, holder: SessionHolder) -> Call[SessionInfo]:
        body = {"holder": holder.model_dump(mode="json")}
        return _model(SessionInfo, (yield Req("POST", f"/sessions/{_pid(ref)}/attach", json=body)))


_CALLS = SessionCalls()


class AsyncSessionCalls:
    """``AsyncClient``'s session methods (it provides ``_run``)."""

    if TYPE_CHECKING:  # AsyncClient's

        async def _run(self, call: Call[T]) -> T: ...

    async def start_session(
        self, spec: SessionSpec, *, idempotency_key: str | None = None
    ) -> SessionInfo:
        return await self._run(_CALLS.start_session(spec, idempotency_key))

    async def list_sessions(self, *, include_ended: bool = False) -> builtins.list[SessionInfo]:
        return await self._run(_CALLS.list_sessions(include_ended=include_ended))

    async def get_session(self, ref: str) -> SessionInfo:
        return await self._run(_CALLS.get_session(ref))

    async def run_cell(
        self,
        ref: str,
        request: CellRequest,
        wait: float = 0.0,
        *,
        idempotency_key: str | None = None,
    ) -> CellPage:
        return await self._run(_CALLS.run_cell(ref, request, wait, idempotency_key))

    async def follow_cell(
        self, ref: str, number: int, since: int = 0, wait: float = 0.0
    ) -> CellPage:
        return await self._run(_CALLS.follow_cell(ref, number, since, wait))

    async def session_cells(self, ref: str, limit: int = 100) -> builtins.list[CellRun]:
        return await self._run(_CALLS.session_cells(ref, limit))

    async def interrupt_session(self, ref: str) -> SessionInfo:
        return await self._run(_CALLS.interrupt_session(ref))

    async def restart_session(self, ref: str) -> SessionInfo:
        return await self._run(_CALLS.restart_session(ref))

    async def stop_session(self, ref: str, reason: str = "stopped by the user") -> SessionInfo:
        return await self._run(_CALLS.stop_session(ref, reason))

    async def attach_session(self, ref: str, holder: SessionHolder) -> SessionInfo:
        return await self._run(_CALLS.attach_session(ref, holder))


class SessionCallsSync:
    """``Client``'s session methods (it provides ``_run``)."""

    if TYPE_CHECKING:  # Client's

        def _run(self, call: Call[T]) -> T: ...

    def start_session(
        self, spec: SessionSpec, *, idempotency_key: str | None = None
    ) -> SessionInfo:
        return self._run(_CALLS.start_session(spec, idempotency_key))

    def list_sessions(self, *, include_ended: bool = False) -> builtins.list[SessionInfo]:
        return self._run(_CALLS.list_sessions(include_ended=include_ended))

    def get_session(self, ref: str) -> SessionInfo:
        return self._run(_CALLS.get_session(ref))

    def run_cell(
        self,
        ref: str,
        request: CellRequest,
        wait: float = 0.0,
        *,
        idempotency_key: str | None = None,
    ) -> CellPage:
        return self._run(_CALLS.run_cell(ref, request, wait, idempotency_key))

    def follow_cell(self, ref: str, number: int, since: int = 0, wait: float = 0.0) -> CellPage:
        return self._run(_CALLS.follow_cell(ref, number, since, wait))

    def session_cells(self, ref: str, limit: int = 100) -> builtins.list[CellRun]:
        return self._run(_CALLS.session_cells(ref, limit))

    def interrupt_session(self, ref: str) -> SessionInfo:
        return self._run(_CALLS.interrupt_session(ref))

    def restart_session(self, ref: str) -> SessionInfo:
        return self._run(_CALLS.restart_session(ref))

    def stop_session(self, ref: str, reason: str = "stopped by the user") -> SessionInfo:
        return self._run(_CALLS.stop_session(ref, reason))

    def attach_session(self, ref: str, holder: SessionHolder) -> SessionInfo:
        return self._run(_CALLS.attach_session(ref, holder))
