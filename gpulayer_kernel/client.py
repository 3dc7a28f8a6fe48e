"""The HTTP client of a served control plane: ``AsyncClient`` and ``Client`` (sync), same calls.

They offer the ControlPlane's client-side calls (the ``Session`` protocol of ``session.py``) plus
administration (tokens, secrets, worker states), so code never cares whether it holds an
in-process ControlPlane or a client. Errors come back as the same exception types
(``errors.from_json``); an unreachable server is ``Unavailable`` (code ``server_unreachable``).

Several URLs (``"https://a:8470,https://b:8470"``, an active control plane and its standby) fail
over as ``failover.py`` says: to the next URL when a request surely was not handled there.

Each call is written once, as a generator that yields requests and receives responses
(``calls.py``); the async and sync clients only differ in how they send them. Each client keeps
its connections alive and reuses them (a new connection costs ~30 ms, a keep-alive round trip
under 1 ms). Long waits (``wait``, ``logs``, ``events``) are split into server-sized long-polls.

    async with AsyncClient("http://127.0.0.1:8470", token) as c:
        job = await c.submit(spec)
        job = await c.wait(job.id)
"""

from __future__ import annotations

import asyncio
import builtins
import time
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

import httpx

from . import versions
from .calls import Call, Calls, Req
from .contracts import (
    PROTOCOL,
    CellPage,
    CellRequest,
    CellRun,
    EventPage,
    Job,
    JobFollow,
    JobSpec,
    JobState,
    LogPage,
    SessionHolder,
    SessionInfo,
    SessionSpec,
    WorkerInfo,
)
from .errors import GPUlayerError, Unavailable, from_json
from .failover import Servers
from .home import Layout, home_dir, read_owner
from .provisioning_calls import AsyncProvisioning, Provisioning
from .security.tls import CA_CERT_ENV, check_url, client_verify, is_loopback

T = TypeVar("T")
API = "/api/v1"


def api_base(url: str) -> str:
    """``http://host:8470`` → ``http://host:8470/api/v1`` (an URL already ending so is kept)."""
    url = url.rstrip("/")
    return url if url.endswith(API) else url + API


def _owner_ca(url: str) -> str | None:
    """The CA file a local ``gpulayer serve`` published beside its address, if this is it."""
    try:
        owner = read_owner(Layout(home_dir()))
    except OSError:
        return None
    if owner.get("url") and api_base(str(owner["url"])) == api_base(url):
        ca = owner.get("ca_cert")
        return str(ca) if ca else None
    return None


def http_client(
    url: str,
    *,
    ca_cert: str | None,
    timeout: float,
    asynchronous: bool,
    headers: dict[str, str] | None = None,
) -> httpx.AsyncClient | httpx.Client:
    """An httpx client with the TLS rule applied and kept-alive connections."""
    check_url(url)
    parts = urlsplit(url)
    if parts.scheme == "https" and ca_cert is None and parts.hostname:
        if is_loopback(parts.hostname):
            ca_cert = _owner_ca(url)
    # A shared context even for http:// (httpx builds one per client otherwise: ~40 ms each).
    verify = client_verify(ca_cert)
    kwargs: dict[str, Any] = {
        "base_url": api_base(url),
        "verify": verify,
        "timeout": httpx.Timeout(timeout, connect=min(timeout, 10.0)),
        # Connections are kept and reused (a new one costs ~30 ms, a reused one < 1 ms). A client
        # opens one per concurrent call (a long-poll plus a cancel; a worker's jobs reporting at
        # once) and keeps each: closing extras after use would reconnect on every burst.
        "limits": httpx.Limits(max_keepalive_connections=16, max_connections=16),
        "headers": headers or {},
        "trust_env": False,  # never send the token through an environment-configured proxy
    }
    return httpx.AsyncClient(**kwargs) if asynchronous else httpx.Client(**kwargs)


def unreachable(url: str, exc: Exception) -> Unavailable:
    text = str(exc) or type(exc).__name__
    hint = "is `gpulayer serve` running there? check GPULAYER_URL"
    if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
        hint = (
            f"the server's certificate is not trusted: pass --ca-cert or set {CA_CERT_ENV} "
            "to the CA that signed it"
        )
    return Unavailable(
        f"cannot reach the control plane at {url}: {text}",
        hint=hint,
        details={"url": url},
        code="server_unreachable",
    )


def error_from(resp: httpx.Response) -> GPUlayerError:
    """Rebuild the server's error, so callers see the same exception type as in-process."""
    try:
        body = resp.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and "code" in body:
        return from_json(resp.status_code, body)
    text = resp.text[:300] if resp.request.method != "HEAD" else ""
    return from_json(
        resp.status_code,
        {"code": f"http_{resp.status_code}", "message": f"HTTP {resp.status_code} {text}".strip()},
    )


class _Base:
    def __init__(self, url: str, token: str, ca_cert: str | None, timeout: float) -> None:
        self.url = url
        self.servers = Servers(url)
        for u in self.servers.urls:
            check_url(u)
        self._calls = Calls()
        self._headers = {versions.HEADER: PROTOCOL}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._ca_cert = ca_cert
        self._timeout = timeout

    def _moved(self, req: Req, outcome: BaseException | httpx.Response, tries: int) -> float | None:
        """Seconds to wait before sending ``req`` again to the next URL, or None: do not."""
        if not self.servers.moves_on(req.method, outcome) or time.monotonic() > self._until:
            return None
        self.servers.move(outcome)
        return self.servers.pause(tries + 1)

    _until = 0.0

    def _check(self, req: Req, resp: httpx.Response) -> httpx.Response:
        self._calls.heard(resp)  # the server's protocol (another major version is refused)
        if resp.status_code >= 400 and resp.status_code not in req.ok:
            raise error_from(resp)
        return resp


class AsyncClient(_Base, AsyncProvisioning):
    """The asyncio client; ``async with AsyncClient(url, token) as c: ...``."""

    def __init__(
        self, url: str, token: str = "", *, ca_cert: str | None = None, timeout: float = 30.0
    ) -> None:
        super().__init__(url, token, ca_cert, timeout)
        self._https: dict[str, httpx.AsyncClient] = {}

    @property
    def _http(self) -> httpx.AsyncClient:
        """The kept-alive connection pool of the URL in use (one per URL)."""
        url = self.servers.url
        if url not in self._https:
            http = http_client(
                url,
                ca_cert=self._ca_cert,
                timeout=self._timeout,
                asynchronous=True,
                headers=self._headers,
            )
            assert isinstance(http, httpx.AsyncClient)
            self._https[url] = http
        return self._https[url]

    async def _send(self, req: Req) -> httpx.Response:
        self._until = self.servers.deadline()
        tries = 0
        while True:
            try:
                resp = await self._http.request(req.method, req.path, **req.send_kwargs())
            except httpx.TransportError as exc:
                delay = self._moved(req, exc, tries)
                if delay is None:
                    raise unreachable(self.servers.url, exc) from None
            else:
                delay = self._moved(req, resp, tries) if resp.status_code == 503 else None
                if delay is None:
                    return resp
            tries += 1
            await asyncio.sleep(delay)  # failover backoff

    async def _run(self, call: Call[T]) -> T:
        try:
            req = next(call)
            while True:
                req = call.send(self._check(req, await self._send(req)))
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        for http in self._https.values():
            await http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # The Session protocol (session.py), in its order, then blobs and administration.

    async def submit(self, spec: JobSpec) -> Job:
        return await self._run(self._calls.submit(spec))

    async def get(self, job_id: str) -> Job:
        return await self._run(self._calls.get(job_id))

    async def run(
        self,
        spec: JobSpec,
        bundle: bytes | None = None,
        wait: float = 0.0,
        linger: float = 0.05,
        limit: int = 1000,
    ) -> JobFollow:
        """Submit and follow in one request (protocol 1.1): a short job comes back ended, with
        its result and log tail; ``bundle``, the spec's bundle, rides along when it is small."""
        return await self._run(self._calls.run(spec, bundle, wait, linger, limit))

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

    async def submit_many(self, specs: Iterable[JobSpec]) -> builtins.list[Job | GPUlayerError]:
        """Several jobs in one request; each entry's job, or why it was refused."""
        return await self._run(self._calls.submit_many(specs))

    async def list(
        self,
        states: Iterable[JobState] = (),
        *,
        name: str | None = None,
        label: tuple[str, str] | None = None,
        limit: int = 100,
    ) -> builtins.list[Job]:
        return await self._run(self._calls.list(states, name=name, label=label, limit=limit))

    async def cancel(self, job_id: str, reason: str = "cancelled by user") -> Job:
        return await self._run(self._calls.cancel(job_id, reason))

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
        path = f"/artifacts/{quote(digest, safe='')}"
        written = 0
        try:
            async with self._http.stream("GET", path, timeout=httpx.Timeout(600.0)) as resp:
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

    async def create_token(
        self,
        kind: str,
        *,
        ttl: float | None = None,
        name: str = "",
        user: str | None = None,
        role: str | None = None,
    ) -> tuple[dict[str, Any], str]:
        call = self._calls.create_token(kind, ttl=ttl, name=name, user=user, role=role)
        return await self._run(call)

    async def list_tokens(self, *, include_inactive: bool = False) -> builtins.list[dict[str, Any]]:
        return await self._run(self._calls.list_tokens(include_inactive=include_inactive))

    async def revoke_token(self, token_id: str) -> dict[str, Any]:
        return await self._run(self._calls.revoke_token(token_id))

    async def set_secret(self, name: str, value: str, *, user: str | None = None) -> None:
        await self._run(self._calls.set_secret(name, value, user=user))

    async def secret_names(self, *, user: str | None = None) -> builtins.list[str]:
        return await self._run(self._calls.secret_names(user=user))

    async def delete_secret(self, name: str, *, user: str | None = None) -> bool:
        return await self._run(self._calls.delete_secret(name, user=user))

    async def rotate_secrets_key(self) -> str:
        return await self._run(self._calls.rotate_secrets_key())

    # users, quotas and identity (the CLI's `gpulayer user|quota`; async only)

    async def whoami(self) -> dict[str, Any]:
        return await self._run(self._calls.whoami())

    async def list_users(self) -> builtins.list[dict[str, Any]]:
        return await self._run(self._calls.list_users())

    async def add_user(
        self, name: str, role: str = "user", *, group: str | None = None
    ) -> dict[str, Any]:
        return await self._run(self._calls.add_user(name, role, group=group))

    async def update_user(self, name: str, **changes: Any) -> dict[str, Any]:
        return await self._run(self._calls.update_user(name, **changes))

    async def list_quotas(self) -> builtins.list[dict[str, Any]]:
        return await self._run(self._calls.list_quotas())

    async def set_quota(
        self, kind: str, name: str, *, max_gpus: int | None, max_queued: int | None
    ) -> dict[str, Any]:
        call = self._calls.set_quota(kind, name, max_gpus=max_gpus, max_queued=max_queued)
        return await self._run(call)

    # Sessions (ADR 0019).

    async def start_session(self, spec: SessionSpec) -> SessionInfo:
        return await self._run(self._calls.start_session(spec))

    async def list_sessions(self, *, include_ended: bool = False) -> builtins.list[SessionInfo]:
        return await self._run(self._calls.list_sessions(include_ended=include_ended))

    async def get_session(self, ref: str) -> SessionInfo:
        return await self._run(self._calls.get_session(ref))

    async def run_cell(self, ref: str, request: CellRequest, wait: float = 0.0) -> CellPage:
        return await self._run(self._calls.run_cell(ref, request, wait))

    async def follow_cell(
        self, ref: str, number: int, since: int = 0, wait: float = 0.0
    ) -> CellPage:
        return await self._run(self._calls.follow_cell(ref, number, since, wait))

    async def session_cells(self, ref: str, limit: int = 100) -> builtins.list[CellRun]:
        return await self._run(self._calls.session_cells(ref, limit))

    async def interrupt_session(self, ref: str) -> SessionInfo:
        return await self._run(self._calls.interrupt_session(ref))

    async def restart_session(self, ref: str) -> SessionInfo:
        return await self._run(self._calls.restart_session(ref))

    async def stop_session(self, ref: str, reason: str = "stopped by the user") -> SessionInfo:
        return await self._run(self._calls.stop_session(ref, reason))

    async def attach_session(self, ref: str, holder: SessionHolder) -> SessionInfo:
        return await self._run(self._calls.attach_session(ref, holder))


class Client(_Base, Provisioning):
    """The synchronous client: the same calls as ``AsyncClient``, for scripts and threads."""

    def __init__(
        self, url: str, token: str = "", *, ca_cert: str | None = None, timeout: float = 30.0
    ) -> None:
        super().__init__(url, token, ca_cert, timeout)
        self._https: dict[str, httpx.Client] = {}

    @property
    def _http(self) -> httpx.Client:
        url = self.servers.url
        if url not in self._https:
            http = http_client(
                url,
                ca_cert=self._ca_cert,
                timeout=self._timeout,
                asynchronous=False,
                headers=self._headers,
            )
            assert isinstance(http, httpx.Client)
            self._https[url] = http
        return self._https[url]

    def _send(self, req: Req) -> httpx.Response:
        self._until = self.servers.deadline()
        tries = 0
        while True:
            try:
                resp = self._http.request(req.method, req.path, **req.send_kwargs())
            except httpx.TransportError as exc:
                delay = self._moved(req, exc, tries)
                if delay is None:
                    raise unreachable(self.servers.url, exc) from None
            else:
                delay = self._moved(req, resp, tries) if resp.status_code == 503 else None
                if delay is None:
                    return resp
            tries += 1
            time.sleep(delay)  # failover backoff (a sync client, off the event loop)

    def _run(self, call: Call[T]) -> T:
        try:
            req = next(call)
            while True:
                req = call.send(self._check(req, self._send(req)))
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    def close(self) -> None:
        for http in self._https.values():
            http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def submit(self, spec: JobSpec) -> Job:
        return self._run(self._calls.submit(spec))

    def get(self, job_id: str) -> Job:
        return self._run(self._calls.get(job_id))

    def run(
        self,
        spec: JobSpec,
        bundle: bytes | None = None,
        wait: float = 0.0,
        linger: float = 0.05,
        limit: int = 1000,
    ) -> JobFollow:
        return self._run(self._calls.run(spec, bundle, wait, linger, limit))

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

    def submit_many(self, specs: Iterable[JobSpec]) -> builtins.list[Job | GPUlayerError]:
        return self._run(self._calls.submit_many(specs))

    def list(
        self,
        states: Iterable[JobState] = (),
        *,
        name: str | None = None,
        label: tuple[str, str] | None = None,
        limit: int = 100,
    ) -> builtins.list[Job]:
        return self._run(self._calls.list(states, name=name, label=label, limit=limit))

    def cancel(self, job_id: str, reason: str = "cancelled by user") -> Job:
        return self._run(self._calls.cancel(job_id, reason))

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

    def create_token(
        self,
        kind: str,
        *,
        ttl: float | None = None,
        name: str = "",
        user: str | None = None,
        role: str | None = None,
    ) -> tuple[dict[str, Any], str]:
        return self._run(self._calls.create_token(kind, ttl=ttl, name=name, user=user, role=role))

    def list_tokens(self, *, include_inactive: bool = False) -> builtins.list[dict[str, Any]]:
        return self._run(self._calls.list_tokens(include_inactive=include_inactive))

    def revoke_token(self, token_id: str) -> dict[str, Any]:
        return self._run(self._calls.revoke_token(token_id))

    def set_secret(self, name: str, value: str, *, user: str | None = None) -> None:
        self._run(self._calls.set_secret(name, value, user=user))

    def secret_names(self, *, user: str | None = None) -> builtins.list[str]:
        return self._run(self._calls.secret_names(user=user))

    def delete_secret(self, name: str, *, user: str | None = None) -> bool:
        return self._run(self._calls.delete_secret(name, user=user))

    # Sessions (ADR 0019).

    def start_session(self, spec: SessionSpec) -> SessionInfo:
        return self._run(self._calls.start_session(spec))

    def list_sessions(self, *, include_ended: bool = False) -> builtins.list[SessionInfo]:
        return self._run(self._calls.list_sessions(include_ended=include_ended))

    def get_session(self, ref: str) -> SessionInfo:
        return self._run(self._calls.get_session(ref))

    def run_cell(self, ref: str, request: CellRequest, wait: float = 0.0) -> CellPage:
        return self._run(self._calls.run_cell(ref, request, wait))

    def follow_cell(self, ref: str, number: int, since: int = 0, wait: float = 0.0) -> CellPage:
        return self._run(self._calls.follow_cell(ref, number, since, wait))

    def session_cells(self, ref: str, limit: int = 100) -> builtins.list[CellRun]:
        return self._run(self._calls.session_cells(ref, limit))

    def interrupt_session(self, ref: str) -> SessionInfo:
        return self._run(self._calls.interrupt_session(ref))

    def restart_session(self, ref: str) -> SessionInfo:
        return self._run(self._calls.restart_session(ref))

    def stop_session(self, ref: str, reason: str = "stopped by the user") -> SessionInfo:
        return self._run(self._calls.stop_session(ref, reason))

    def attach_session(self, ref: str, holder: SessionHolder) -> SessionInfo:
        return self._run(self._calls.attach_session(ref, holder))


__all__ = ["AsyncClient", "Client", "api_base", "error_from"]
