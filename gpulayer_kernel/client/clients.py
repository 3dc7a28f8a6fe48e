"""The HTTP client of a served control plane: ``AsyncClient`` and ``Client`` (sync), same calls.

They offer the ControlPlane's client-side calls (the ``Connection`` protocol of ``connect.py``) plus
administration (tokens, secrets, worker states), so code never cares whether it holds an
in-process ControlPlane or a client. Errors come back as the same exception types
(``errors.from_json``); an unreachable server is ``Unavailable`` (code ``server_unreachable``).

Several URLs (``"https://a:8470,https://b:8470"``, an active control plane and its standby) fail
over as ``ha/failover.py`` says: to the next URL when a request surely was not handled there,
and past a hung server within seconds (short connect and first-byte timeouts per URL; a
long-poll keeps its own).

Each call is written once, as a generator that yields requests and receives responses
(``calls.py``; sessions' in ``sessions.py``, administration's in ``admin.py``,
provisioning's in ``provisioning.py``, mixed in); the clients only differ in how they send
them. Each client keeps
its connections alive and reuses them (a new connection costs ~30 ms, a keep-alive round trip
under 1 ms). Long waits (``wait``, ``logs``, ``events``) are split into server-sized long-polls.

    async with AsyncClient("http://127.0.0.1:8470", token) as c:
        job = await c.submit(spec)
        job = await c.wait(job.id)
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import quote

import httpx

from ..contracts import (
    EventPage,
    Job,
    JobFollow,
    JobSpec,
    JobState,
    LogPage,
    WorkerInfo,
)
from ..errors import GPUlayerError
from ..ha.failover import Servers
from ..wire.http import SyncWire, Wire
from .admin import Admin, AsyncAdmin
from .calls import Call, Calls, Req
from .httpbase import error_from, unreachable
from .provisioning import AsyncProvisioning, Provisioning
from .sessions import AsyncSessionCalls, SessionCallsSync

T = TypeVar("T")


NO_TUNNEL_ENV = "GPULAYER_NO_TUNNEL"


class AsyncClient(AsyncProvisioning, AsyncSessionCalls, AsyncAdmin):
    """The asyncio client; ``async with AsyncClient(url, token) as c: ...``."""

    def __init__(
        self,
        url: str,
        token: str = "",
        *,
        ca_cert: str | None = None,
        timeout: float = 30.0,
        tunnel: bool | None = None,
    ) -> None:
        """``tunnel``: from its second request on, send the small ones on one WebSocket where
        the server has the client tunnel (``gpulayer serve``; ``wire/tunnel.py``); by default
        yes, unless ``GPULAYER_NO_TUNNEL=1`` (a proxy that takes the upgrade and then stalls)."""
        if tunnel is None:
            tunnel = os.environ.get(NO_TUNNEL_ENV, "") not in ("1", "true", "yes")
        self.url = url
        self._calls = Calls()
        # GPUlayer's one HTTP client (wire/http.py): failover, pools, TLS, token, errors; the
        # calls note the server's protocol from each answer.
        self.wire = Wire(
            url,
            token or None,
            ca_cert=ca_cert,
            timeout=timeout,
            check_peer=False,
            tunnel="client" if tunnel else None,
        )
        self.wire.heard = self._calls.heard

    @property
    def servers(self) -> Servers:
        return self.wire.servers

    async def _run(self, call: Call[T]) -> T:
        return await self.wire.run(call)

    async def aclose(self) -> None:
        await self.wire.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # The Connection protocol (connect.py), in its order, then blobs and workers; sessions,
    # administration and provisioning come from their mixins.

    async def submit(self, spec: JobSpec, *, idempotency_key: str | None = None) -> Job:
        return await self._run(self._calls.submit(spec, idempotency_key))

    async def get(self, job_id: str) -> Job:
        return await self._run(self._calls.get(job_id))

    async def run(
        self,
        spec: JobSpec,
        bundle: bytes | None = None,
        wait: float = 0.0,
        linger: float = 0.05,
        limit: int = 1000,
        *,
        idempotency_key: str | None = None,
    ) -> JobFollow:
        """Submit and follow in one request (protocol 1.1): a short job comes back ended, with
        its result and log tail; ``bundle``, the spec's bundle, rides along when it is small."""
        return await self._run(self._calls.run(spec, bundle, wait, linger, limit, idempotency_key))

    async def follow(
        self,
        job_id: str,
        since: int = 0,
        cursor: str | None = None,
        wait: float = 0.0,
        linger: float = 0.05,
        limit: int = 1000,
    ) -> JobFollow:
        """The job and its log records after ``since``, once it changes after ``cursor``."""
        return await self._run(self._calls.follow(job_id, since, cursor, wait, linger, limit))

    async def submit_many(
        self, specs: Iterable[JobSpec], *, idempotency_key: str | None = None
    ) -> builtins.list[Job | GPUlayerError]:
        """Several jobs in one request; each entry's job, or why it was refused."""
        return await self._run(self._calls.submit_many(specs, idempotency_key))

    async def list(
        self,
        states: Iterable[JobState] = (),
        *,
        name: str | None = None,
        label: tuple[str, str] | None = None,
        limit: int = 100,
    ) -> builtins.list[Job]:
        return await self._run(self._calls.list(states, name=name, label=label, limit=limit))

    async def cancel(
        self,
        job_id: str,
        reason: str = "cancelled by user",
        *,
        idempotency_key: str | None = None,
    ) -> Job:
        return await self._run(self._calls.cancel(job_id, reason, idempotency_key))

    async def wait(self, job_id: str, timeout: float | None = None) -> Job:
        return await self._run(self._calls.wait(job_id, timeout))

    async def logs(
        self, job_id: str, since: int = 0, wait: float = 0.0, limit: int = 1000
    ) -> LogPage:
        return await self._run(self._calls.logs(job_id, since, wait, limit))

    async def explain(self, job_id: str) -> str:
        return await self._run(self._calls.explain(job_id))

    async def workers(self) -> builtins.list[WorkerInfo]:
        return await self._run(self._calls.workers())

    async def events(
        self, since: int = 0, wait: float = 0.0, cursor: str | None = None
    ) -> EventPage:
        return await self._run(self._calls.events(since, wait, cursor))

    async def event_cursor(self) -> str:
        return await self._run(self._calls.event_cursor())

    async def put_bundle(self, data: bytes, digest: str | None = None) -> str:
        return await self._run(self._calls.put_bundle(data, digest))

    async def has_bundle(self, digest: str) -> bool:
        return await self._run(self._calls.has_bundle(digest))

    async def get_blob(self, digest: str) -> bytes:
        return await self._run(self._calls.get_blob(digest))

    put_blob = put_bundle
    has_blob = has_bundle

    async def get_bundle(self, digest: str) -> bytes:
        return await self._run(self._calls.get_bundle(digest))

    async def download_blob(self, digest: str, write: Callable[[bytes], object]) -> int:
        """Stream one blob (an artifact, a bundle) to ``write`` chunk by chunk; bytes written.

        For files too large to hold in memory (``get_blob`` returns them whole); the caller
        checks the content against ``digest`` as it writes.
        """
        req = Req("GET", f"/artifacts/{quote(digest, safe='')}")
        written = 0
        try:
            async with self.wire.pool().stream(
                "GET", req.path, headers=self.wire.headers(req, None), timeout=httpx.Timeout(600.0)
            ) as resp:
                if resp.status_code >= 400:
                    await resp.aread()
                    raise error_from(resp)
                async for chunk in resp.aiter_bytes(1 << 20):
                    write(chunk)
                    written += len(chunk)
        except httpx.TransportError as exc:
            raise unreachable(self.url, exc) from None
        return written

    async def artifact(self, job_id: str, name: str) -> bytes:
        return await self._run(self._calls.artifact(job_id, name))

    async def status(self) -> dict[str, Any]:
        return await self._run(self._calls.status())

    async def set_worker_state(self, worker_id: str, state: str) -> WorkerInfo:
        return await self._run(self._calls.set_worker_state(worker_id, state))

    async def remove_worker(self, ref: str, *, force: bool = False) -> WorkerInfo:
        return await self._run(self._calls.remove_worker(ref, force=force))


class Client(Provisioning, SessionCallsSync, Admin):
    """The synchronous client: the same calls as ``AsyncClient``, for scripts and threads."""

    def __init__(
        self, url: str, token: str = "", *, ca_cert: str | None = None, timeout: float = 30.0
    ) -> None:
        self.url = url
        self._calls = Calls()
        self.wire = SyncWire(url, token or None, ca_cert=ca_cert, timeout=timeout, check_peer=False)
        self.wire.heard = self._calls.heard

    @property
    def servers(self) -> Servers:
        return self.wire.servers

    def _run(self, call: Call[T]) -> T:
        return self.wire.run(call)

    def close(self) -> None:
        self.wire.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def submit(self, spec: JobSpec, *, idempotency_key: str | None = None) -> Job:
        return self._run(self._calls.submit(spec, idempotency_key))

    def get(self, job_id: str) -> Job:
        return self._run(self._calls.get(job_id))

    def run(
        self,
        spec: JobSpec,
        bundle: bytes | None = None,
        wait: float = 0.0,
        linger: float = 0.05,
        limit: int = 1000,
        *,
        idempotency_key: str | None = None,
    ) -> JobFollow:
        return self._run(self._calls.run(spec, bundle, wait, linger, limit, idempotency_key))

    def follow(
        self,
        job_id: str,
        since: int = 0,
        cursor: str | None = None,
        wait: float = 0.0,
        linger: float = 0.05,
        limit: int = 1000,
    ) -> JobFollow:
        return self._run(self._calls.follow(job_id, since, cursor, wait, linger, limit))

    def submit_many(
        self, specs: Iterable[JobSpec], *, idempotency_key: str | None = None
    ) -> builtins.list[Job | GPUlayerError]:
        return self._run(self._calls.submit_many(specs, idempotency_key))

    def list(
        self,
        states: Iterable[JobState] = (),
        *,
        name: str | None = None,
        label: tuple[str, str] | None = None,
        limit: int = 100,
    ) -> builtins.list[Job]:
        return self._run(self._calls.list(states, name=name, label=label, limit=limit))

    def cancel(
        self,
        job_id: str,
        reason: str = "cancelled by user",
        *,
        idempotency_key: str | None = None,
    ) -> Job:
        return self._run(self._calls.cancel(job_id, reason, idempotency_key))

    def wait(self, job_id: str, timeout: float | None = None) -> Job:
        return self._run(self._calls.wait(job_id, timeout))

    def logs(self, job_id: str, since: int = 0, wait: float = 0.0, limit: int = 1000) -> LogPage:
        return self._run(self._calls.logs(job_id, since, wait, limit))

    def explain(self, job_id: str) -> str:
        return self._run(self._calls.explain(job_id))

    def workers(self) -> builtins.list[WorkerInfo]:
        return self._run(self._calls.workers())

    def events(self, since: int = 0, wait: float = 0.0, cursor: str | None = None) -> EventPage:
        return self._run(self._calls.events(since, wait, cursor))

    def event_cursor(self) -> str:
        return self._run(self._calls.event_cursor())

    def put_bundle(self, data: bytes, digest: str | None = None) -> str:
        return self._run(self._calls.put_bundle(data, digest))

    def has_bundle(self, digest: str) -> bool:
        return self._run(self._calls.has_bundle(digest))

    def get_blob(self, digest: str) -> bytes:
        return self._run(self._calls.get_blob(digest))

    put_blob = put_bundle
    has_blob = has_bundle

    def get_bundle(self, digest: str) -> bytes:
        return self._run(self._calls.get_bundle(digest))

    def artifact(self, job_id: str, name: str) -> bytes:
        return self._run(self._calls.artifact(job_id, name))

    def status(self) -> dict[str, Any]:
        return self._run(self._calls.status())

    def set_worker_state(self, worker_id: str, state: str) -> WorkerInfo:
        return self._run(self._calls.set_worker_state(worker_id, state))

    def remove_worker(self, ref: str, *, force: bool = False) -> WorkerInfo:
        return self._run(self._calls.remove_worker(ref, force=force))


__all__ = ["AsyncClient", "Client"]
