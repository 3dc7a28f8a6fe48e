"""A synchronous bridge from the kernel's main thread to a GPUlayer Connection on a private loop.

A ``%%gpulayer`` cell runs synchronously on the kernel's main thread, and ipykernel's own event
loop is busy running that very cell, so the Connection cannot live there. The bridge owns one daemon
thread with its own asyncio loop; on it lives the Connection the kernel talks to:

* the embedded default (ControlPlane on SQLite under ``$GPULAYER_HOME`` + an in-process local
  worker) when no server is configured — plain IPython, a script, nbval;
* the HTTP client (``gpulayer_kernel.client.clients.AsyncClient``) when ``GPULAYER_URL`` is set (the
  Jupyter server extension sets it, with ``GPULAYER_TOKEN``, in every kernel's environment) or
  after ``%gpulayer connect URL``.

Each call hops onto that loop as a task and blocks the caller until the answer, which the task's
last step sets (the caller wakes in that turn of the loop). The wait is interruptible: Ctrl-C or
"interrupt kernel" raises ``KeyboardInterrupt`` in the caller and cancels the call on the loop.
``watch`` follows a job and hands updates to a callback on the loop thread.

A one-shot cell costs as few requests as protocol 1.1 allows (ADR 0003): its bundle rides with
its submit (``upload_bundle`` stages it; ``submit`` sends it with the job in one ``run`` request,
once per digest), the run's answer is the cell's first follow page (a short cell's whole life:
its state, result and output), and following it is one long-poll per change (``follow``: state,
progress, result and lines together, no timers). A server that predates 1.1 is spoken to in 1.0.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from ..client.connect import LONG_POLL, URL_ENV, Connection, open_session
from ..codes import ErrorCode
from ..contracts import Job, JobFollow, JobSpec, JobState, LogPage, LogRecord, WorkerInfo
from ..contracts.reports import MAX_INLINE_BUNDLE
from ..errors import GPUlayerError, NotFound, Unavailable
from ..home import home_dir

T = TypeVar("T")

CONNECT_TIMEOUT = 120.0  # the probe of a local worker takes ~1.5 s; a cold import can take more
CLOSE_TIMEOUT = 30.0  # a running job gets its kill grace (5 s) to stop when the kernel exits
# A young job's first answer waits this long for its end: a short cell is one request.
LINGER = 0.05
RETRY_FOR = 120.0  # seconds a follow rides out a control plane that is away (a restart)


@dataclass(frozen=True)
class Target:
    """Which control plane to open: a URL, an explicit embedded one, or the default choice."""

    url: str | None = None
    token: str | None = None
    local: bool = False  # embedded even when GPULAYER_URL is set
    home: str | None = None
    simulate_gpus: int | None = None
    simulate_kind: str | None = None


@dataclass
class Update:
    """One thing that happened to a watched job."""

    kind: Literal["job", "logs", "done", "error"]
    job: Job | None = None
    records: Sequence[LogRecord] = field(default_factory=list)
    error: BaseException | None = None


class Watch:
    """A running ``Bridge.watch``; ``stop()`` ends it (the job goes on)."""

    def __init__(self, future: concurrent.futures.Future[None]) -> None:
        self._future = future

    def stop(self) -> None:
        self._future.cancel()

    @property
    def done(self) -> bool:
        return self._future.done()


class Bridge:
    """A Connection on a background loop, with blocking, interruptible calls for the kernel."""

    def __init__(self, target: Target | None = None) -> None:
        self.target = target or Target()
        self.embedded = False
        self.closed = False
        self._session: Connection | None = None
        self._error: BaseException | None = None
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._watches: set[asyncio.Task[None]] = set()
        self._staged: dict[str, bytes] = {}  # bundles for the next submit (upload_bundle)
        self._sent: set[str] = set()  # digests the control plane has from this bridge
        self._first: dict[str, JobFollow] = {}  # a submit's answer: its job's first page
        self._thread = threading.Thread(target=self._run, name="gpulayer-bridge", daemon=True)
        self._thread.start()

    # -- life ------------------------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._main())
        finally:
            with contextlib.suppress(Exception):
                self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        try:
            async with self._open() as session:
                self._session = session
                self._ready.set()
                await self._stop.wait()
                # Stop following jobs before the session goes away; an embedded worker then
                # stops its running jobs and reports them cancelled.
                for t in self._watches:
                    t.cancel()
                await asyncio.gather(*self._watches, return_exceptions=True)
        except BaseException as exc:
            self._error = exc
        finally:
            self._session = None
            self._ready.set()

    @contextlib.asynccontextmanager
    async def _open(self) -> AsyncIterator[Connection]:
        t = self.target
        if t.url:
            try:
                from ..client.clients import AsyncClient  # type: ignore[import-not-found,unused-ignore]
            except ImportError as exc:  # pragma: no cover - ships with the package
                raise Unavailable(f"the HTTP client is unavailable: {exc}") from None
            async with AsyncClient(t.url, t.token or "") as client:
                yield client
            return
        if t.local or t.home or t.simulate_gpus is not None or t.simulate_kind:
            from ..embedded import Embedded

            async with Embedded(
                t.home,
                local_worker=True,
                simulate_gpus=t.simulate_gpus,
                simulate_kind=t.simulate_kind,
            ) as emb:
                self.embedded = True
                yield emb.cp
            return
        async with open_session(local_worker=True) as session:
            from ..controlplane import ControlPlane

            self.embedded = isinstance(session, ControlPlane)
            yield session

    def ready(self, timeout: float | None = CONNECT_TIMEOUT) -> Connection:
        """The Connection, once open; raises why it could not be opened."""
        if not self._ready.wait(timeout):
            raise Unavailable(
                f"the control plane did not open within {timeout:g}s",
                hint="check `%gpulayer status`; restart the kernel if it persists",
            )
        if self._session is None:
            err = self._error
            if isinstance(err, GPUlayerError):
                raise err
            if err is not None:
                raise Unavailable(
                    f"could not open the GPUlayer control plane: {err}",
                    hint="check GPULAYER_URL/GPULAYER_TOKEN, or set GPULAYER_HOME to a free folder",
                ) from err
            raise Unavailable("this GPUlayer connection is closed", hint="run the cell again")
        return self._session

    @property
    def failed(self) -> bool:
        """True when opening the Connection failed (the next ``get_bridge()`` tries again)."""
        return self._ready.is_set() and self._session is None and self._error is not None

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Close the Connection (an embedded worker stops its running jobs first)."""
        if self.closed:
            return
        self.closed = True
        if self._thread.is_alive() and self._stop is not None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                self._loop.call_soon_threadsafe(self._stop.set)
        elif self._thread.is_alive():  # still opening: let it finish, then stop
            self._ready.wait(timeout)
            if self._stop is not None:
                with contextlib.suppress(RuntimeError):
                    self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)

    # -- calls -----------------------------------------------------------------------------------

    def call(self, fn: Callable[[Connection], Awaitable[T]], timeout: float | None = None) -> T:
        """Run ``fn(session)`` on the bridge loop and wait for it (Ctrl-C cancels it)."""
        session = self.ready()
        if self.closed:
            raise Unavailable("this GPUlayer connection is closed", hint="run the cell again")

        # The answer is set by the call's own last step, so the caller wakes in that turn of
        # the loop (``run_coroutine_threadsafe`` sets it from a callback a turn later).
        answer: concurrent.futures.Future[T] = concurrent.futures.Future()
        started: list[asyncio.Task[None]] = []

        async def run() -> None:
            try:
                result = await fn(session)
            except asyncio.CancelledError:
                answer.cancel()
                raise
            except BaseException as exc:
                if answer.set_running_or_notify_cancel():
                    answer.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise  # SystemExit and the like stay the loop's, as the caller learns of it
            else:
                if answer.set_running_or_notify_cancel():
                    answer.set_result(result)

        def cancel() -> None:  # on the loop, after the task was made (callbacks run in order);
            # a task cancelled before its first step never runs ``fn``
            if started:
                started[0].cancel()

        self._loop.call_soon_threadsafe(lambda: started.append(self._loop.create_task(run())))
        try:
            return answer.result(timeout)
        except (concurrent.futures.TimeoutError, KeyboardInterrupt):
            answer.cancel()
            self._loop.call_soon_threadsafe(cancel)
            raise

    def submit(self, spec: JobSpec) -> Job:
        """Submit and start following in one request (its bundle with it, when staged): the
        answer, the job's first page, is kept for ``watch``."""
        digest = getattr(spec.workload, "bundle", None)
        data = self._staged.pop(digest, None) if digest is not None else None

        async def run(s: Connection) -> JobFollow:
            send = data if data is not None and digest not in self._sent else None
            try:
                return await s.run(spec, send, wait=LONG_POLL, linger=LINGER)
            except NotFound as exc:
                if exc.code != ErrorCode.BUNDLE_NOT_FOUND or data is None or send is not None:
                    raise
                # The control plane lost what it had (a new state directory): send it again.
                return await s.run(spec, data, wait=LONG_POLL, linger=LINGER)

        page = self.call(run)
        if digest is not None:
            self._sent.add(digest)
        self._first[page.job.id] = page
        return page.job

    def get(self, job_id: str) -> Job:
        return self.call(lambda s: s.get(job_id))

    def jobs(self, states: Iterable[JobState] = (), *, limit: int = 20) -> list[Job]:
        return self.call(lambda s: s.list(tuple(states), limit=limit))

    def cancel(self, job_id: str, reason: str = "cancelled by user") -> Job:
        return self.call(lambda s: s.cancel(job_id, reason))

    def wait(self, job_id: str, timeout: float | None = None) -> Job:
        return self.call(lambda s: s.wait(job_id, timeout))

    def logs(self, job_id: str, since: int = 0, limit: int = 1000) -> LogPage:
        return self.call(lambda s: s.logs(job_id, since=since, limit=limit))

    def all_logs(self, job_id: str) -> list[LogRecord]:
        out: list[LogRecord] = []
        since = 0
        while True:
            page = self.logs(job_id, since=since, limit=5000)
            if not page.records:
                return out
            out.extend(page.records)
            since = page.next_since

    def explain(self, job_id: str) -> str:
        return self.call(lambda s: s.explain(job_id))

    def workers(self) -> list[WorkerInfo]:
        return self.call(lambda s: s.workers())

    def get_blob(self, digest: str) -> bytes:
        return self.call(lambda s: s.get_blob(digest))

    def wait_scheduled(self, job_id: str, timeout: float = 2.0) -> Job:
        """The job after its first scheduling pass: placed, or queued with a pending reason.

        ``--no-wait`` returns after this, so the handle it shows already says where the job went
        or why it waits. Returns the job as it is at ``timeout`` otherwise.
        """
        first = self._first.pop(job_id, None)

        async def run(s: Connection) -> Job:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            page = first or await s.follow(job_id)
            while page.job.state == JobState.QUEUED and page.job.pending is None:
                left = deadline - loop.time()
                if left <= 0:
                    break
                page = await s.follow(job_id, page.next_since, page.cursor, wait=left, linger=0.0)
            return page.job

        return self.call(run)

    def upload_bundle(self, digest: str, data: bytes) -> bool:
        """Make a bundle available to the next ``submit`` of a job that names it: a small one
        rides with that submit (one request for both, once per digest), a larger one is
        uploaded now unless the control plane has it. True if it was sent (or will be)."""
        self._staged[digest] = data
        if digest in self._sent:
            return False
        if len(data) <= MAX_INLINE_BUNDLE:
            return True

        async def run(s: Connection) -> bool:
            if await s.has_bundle(digest):
                return False
            await s.put_bundle(data, digest)
            return True

        uploaded = self.call(run)
        self._sent.add(digest)
        return uploaded

    # -- following a job -------------------------------------------------------------------------

    def watch(self, job_id: str, sink: Callable[[Update], None]) -> Watch:
        """Follow a job: ``sink`` gets its changes and log batches, then ``done`` (or ``error``).

        ``sink`` runs on the bridge thread: it must be quick and thread-safe (a queue put, a
        widget trait update).
        """
        session = self.ready()
        first = self._first.pop(job_id, None)

        async def run() -> None:
            task = asyncio.current_task()
            assert task is not None
            self._watches.add(task)
            try:
                await _follow(session, job_id, sink, first)
            finally:
                self._watches.discard(task)

        return Watch(asyncio.run_coroutine_threadsafe(run(), self._loop))

    def describe(self) -> str:
        """Which control plane this bridge talks to, in words."""
        if self.target.url:
            return f"served control plane at {self.target.url}"
        if self.embedded:
            home = self.target.home or str(home_dir())
            sim = self.target.simulate_gpus
            extra = f", {sim} simulated GPUs" if sim else ""
            return f"embedded control plane in {home} (local worker in this kernel{extra})"
        where = os.environ.get(URL_ENV) or f"the owner of {home_dir()}"
        return f"served control plane at {where}"


async def _follow(
    s: Connection, job_id: str, sink: Callable[[Update], None], first: JobFollow | None
) -> None:
    """Pass on the job's state, pending explanation, progress and lines as they come, one
    long-poll per change (a submit's answer is the first page), then its end."""
    try:
        page = first or await s.follow(job_id)
        while True:
            if page.records:
                sink(Update("logs", records=page.records))
            if page.job.state.terminal and not page.more:
                break
            sink(Update("job", job=page.job))
            page = await _next_page(s, job_id, page)
        sink(Update("done", job=page.job))
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        sink(Update("error", error=exc))


async def _next_page(s: Connection, job_id: str, page: JobFollow) -> JobFollow:
    """The page after ``page``, riding out a control plane that is away for a while (its
    cursor then says it restarted: the page after it comes at once)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + RETRY_FOR
    failures = 0
    while True:
        try:
            return await s.follow(
                job_id, page.next_since, page.cursor, wait=LONG_POLL, linger=LINGER
            )
        except Unavailable:
            if loop.time() > deadline:
                raise
            failures += 1
            await asyncio.sleep(min(5.0, 0.2 * 2**failures))  # retry backoff


# -- the kernel's bridge ---------------------------------------------------------------------------

_lock = threading.Lock()
_current: Bridge | None = None


def get_bridge() -> Bridge:
    """The kernel's bridge, opened on first use (and again after a failed open)."""
    global _current
    with _lock:
        if _current is None or _current.closed or _current.failed:
            target = _current.target if _current is not None and _current.failed else None
            _current = Bridge(target)
        return _current


def current_bridge() -> Bridge | None:
    return _current


def reconnect(target: Target) -> Bridge:
    """Close the kernel's bridge (if any) and open one to ``target``."""
    global _current
    with _lock:
        old, _current = _current, None
    if old is not None:
        old.close()
    with _lock:
        _current = Bridge(target)
        return _current


def close_bridge() -> None:
    global _current
    with _lock:
        old, _current = _current, None
    if old is not None:
        old.close()


atexit.register(close_bridge)
