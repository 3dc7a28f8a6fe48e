"""Finding the control plane to talk to, the same way for the CLI, magics and scripts.

Order: ``GPULAYER_URL`` (a served control plane, with ``GPULAYER_TOKEN``) → the live owner of
``$GPULAYER_HOME`` when it publishes an address → the embedded default, opened in-process. Whatever
is found offers the ControlPlane's calls (``Connection``), so callers never care which they hold.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import os
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Protocol

from ..contracts import (
    Budget,
    BudgetList,
    BudgetStatus,
    CellPage,
    CellRequest,
    CellRun,
    CostReport,
    EventPage,
    InstanceList,
    Job,
    JobFollow,
    JobSpec,
    JobState,
    LogPage,
    ProviderList,
    SessionHolder,
    SessionInfo,
    SessionSpec,
    WorkerInfo,
)
from ..contracts.costs import GroupBy
from ..embedded import Embedded, ServeOptions
from ..errors import GPUlayerError, Unavailable
from ..home import Layout, home_dir, live_owner

URL_ENV = "GPULAYER_URL"
TOKEN_ENV = "GPULAYER_TOKEN"


class Connection(Protocol):
    """The client-side calls shared by the in-process ControlPlane and the HTTP client."""

    async def submit(self, spec: JobSpec) -> Job: ...
    async def get(self, job_id: str) -> Job: ...
    # protocol 1.1: submit and follow in one call, follow in one long-poll, batched submits
    async def run(
        self,
        spec: JobSpec,
        bundle: bytes | None = None,
        wait: float = 0.0,
        linger: float = ...,
        limit: int = 1000,
    ) -> JobFollow: ...
    async def follow(
        self,
        job_id: str,
        since: int = 0,
        cursor: str | None = None,
        wait: float = 0.0,
        linger: float = ...,
        limit: int = 1000,
    ) -> JobFollow: ...
    async def submit_many(self, specs: Sequence[JobSpec]) -> builtins.list[Job | GPUlayerError]: ...
    async def list(
        self,
        states: Iterable[JobState] = (),
        *,
        name: str | None = None,
        label: tuple[str, str] | None = None,
        limit: int = 100,
    ) -> builtins.list[Job]: ...
    async def cancel(self, job_id: str, reason: str = ...) -> Job: ...
    async def wait(self, job_id: str, timeout: float | None = None) -> Job: ...
    async def logs(
        self, job_id: str, since: int = 0, wait: float = 0.0, limit: int = 1000
    ) -> LogPage: ...
    async def explain(self, job_id: str) -> str: ...
    async def workers(self) -> builtins.list[WorkerInfo]: ...
    async def remove_worker(self, ref: str, *, force: bool = False) -> WorkerInfo: ...
    async def events(
        self, since: int = 0, wait: float = 0.0, cursor: str | None = None
    ) -> EventPage: ...
    async def event_cursor(self) -> str: ...
    async def put_bundle(self, data: bytes, digest: str | None = None) -> str: ...
    async def has_bundle(self, digest: str) -> bool: ...
    async def get_blob(self, digest: str) -> bytes: ...
    async def put_blob(self, data: bytes, digest: str | None = None) -> str: ...
    # Notebook sessions (ADR 0019).
    async def start_session(self, spec: SessionSpec) -> SessionInfo: ...
    async def list_sessions(self, *, include_ended: bool = False) -> builtins.list[SessionInfo]: ...
    async def get_session(self, ref: str) -> SessionInfo: ...
    async def run_cell(self, ref: str, request: CellRequest, wait: float = 0.0) -> CellPage: ...
    async def follow_cell(
        self, ref: str, number: int, since: int = 0, wait: float = 0.0
    ) -> CellPage: ...
    async def session_cells(self, ref: str, limit: int = 100) -> builtins.list[CellRun]: ...
    async def interrupt_session(self, ref: str) -> SessionInfo: ...
    async def restart_session(self, ref: str) -> SessionInfo: ...
    async def stop_session(self, ref: str, reason: str = ...) -> SessionInfo: ...
    async def attach_session(self, ref: str, holder: SessionHolder) -> SessionInfo: ...
    # providers, costs, budgets (ADR 0010, 0011)
    async def providers(self) -> ProviderList: ...
    async def instances(self, ended: bool = False) -> InstanceList: ...
    async def costs(self, by: GroupBy = "job", since: float | None = None) -> CostReport: ...
    async def budgets(self) -> BudgetList: ...
    async def set_budget(self, budget: Budget) -> BudgetStatus: ...
    async def delete_budget(self, name: str) -> None: ...


def find_remote() -> tuple[str, str] | None:
    """``(url, token)`` of a control plane to reach over HTTP; None: open the embedded one."""
    url = os.environ.get(URL_ENV)
    if url:
        return url, os.environ.get(TOKEN_ENV, "")
    owner = live_owner(Layout(home_dir()))
    if owner.get("url") and owner.get("token"):
        return str(owner["url"]), str(owner["token"])
    return None


@contextlib.asynccontextmanager
async def open_session(*, local_worker: bool = False) -> AsyncIterator[Connection]:
    """Yield a connection to the control plane found (the name predates notebook sessions, and
    stays: scripts import it); ``local_worker`` starts an in-process worker (and a loopback API)."""
    remote = find_remote()
    if remote is not None:
        try:
            from .clients import AsyncClient
        except ImportError as exc:  # pragma: no cover - the client ships with the package
            raise Unavailable(f"the HTTP client is unavailable: {exc}") from None
        async with AsyncClient(remote[0], remote[1]) as client:
            yield client
        return
    # A long-lived embedded host (one with a local worker: `gpulayer run`, a kernel) also serves
    # the API on loopback and publishes it in the lock file, so that `gpulayer jobs` in another
    # terminal connects to it instead of failing on the lock (DESIGN rule 3).
    serve = ServeOptions(soon=True) if local_worker else False  # not on the way to its first job
    async with Embedded(local_worker=local_worker, serve=serve) as emb:
        yield emb.cp


LONG_POLL = 25.0  # seconds one logs/events long-poll may wait; a server answers at once on news


async def job_changes(s: Connection, job_id: str, cursor: str) -> AsyncIterator[Job]:
    """The job each time it changes, followed on the event stream from ``cursor`` (long-poll).

    A restart of the control plane shows as ``reset`` (the cursor's epoch changed): the job is read
    again. Connection errors are retried with backoff; the caller stops when it has seen enough.
    """
    failures = 0
    while True:
        try:
            page = await s.events(cursor=cursor, wait=LONG_POLL)
            failures = 0
        except asyncio.CancelledError:
            raise
        except Exception:
            failures += 1
            await asyncio.sleep(min(5.0, 0.2 * 2**failures))  # retry backoff
            continue
        cursor = page.cursor
        latest = next(
            (e.job for e in reversed(page.events) if e.job is not None and e.job.id == job_id),
            None,
        )
        if page.reset:
            latest = await s.get(job_id)
        if latest is not None:
            yield latest
