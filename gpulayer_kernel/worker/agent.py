"""The worker agent: joins a control plane, long-polls for work, runs jobs, reports back.

One agent, any transport (ADR 0003): the embedded default hands it an ``InProcessTransport``;
``gpulayer worker`` hands it an ``HttpTransport``. Waiting for work is a long-poll that the control
plane answers the moment a job is assigned (ADR 0016); the only sleeps are retry backoffs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random

from ..contracts import FinishReport, JobAssignment, WorkerInfo, WorkerRegistration
from ..errors import Conflict, GPUlayerError, NotFound, Unauthorized
from . import zygote
from .executor import ExecutorConfig, JobExecutor, reap_leftovers
from .transport import Transport

log = logging.getLogger("gpulayer.worker")


def backoff(attempt: int, base: float = 0.2, cap: float = 10.0) -> float:
    """Capped exponential backoff with full jitter."""
    return random.uniform(0, min(cap, base * 2**attempt))


class WorkerAgent:
    def __init__(
        self,
        transport: Transport,
        registration: WorkerRegistration,
        config: ExecutorConfig,
        *,
        heartbeat_interval: float = 5.0,
        poll_wait: float = 25.0,
    ) -> None:
        self.transport = transport
        self.registration = registration
        self.config = config
        self.heartbeat_interval = heartbeat_interval
        self.poll_wait = poll_wait
        self.info: WorkerInfo | None = None
        self.running: dict[str, JobExecutor] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._loops: list[asyncio.Task[None]] = []
        self._stopping = False
        self.joined = asyncio.Event()

    async def start(self) -> WorkerInfo:
        killed = await asyncio.to_thread(reap_leftovers, self.config.work_root)
        if killed:
            log.warning("stopped %d process(es) left by jobs of a crashed worker", len(killed))
        self.info = await self.transport.register(self.registration)
        self.joined.set()
        self._loops = [
            asyncio.create_task(self._poll_loop()),
            asyncio.create_task(self._heartbeat_loop()),
        ]
        return self.info

    async def wait(self) -> None:
        await asyncio.gather(*self._loops, return_exceptions=True)

    async def stop(self, reason: str = "the worker is shutting down") -> None:
        """Stop taking work, stop running jobs (their reports are sent), then leave."""
        self._stopping = True
        for t in self._loops:
            t.cancel()
        for ex in list(self.running.values()):
            ex.cancel(reason)
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=self.config.kill_grace + 10)
        zygote.shutdown(self.config)  # the warm runner goes with its worker
        with contextlib.suppress(Exception):
            await self.transport.deregister()
        await self.transport.close()

    async def _rejoin(self) -> None:
        self.info = await self.transport.register(self.registration)
        log.info("re-joined the control plane as %s", self.info.id)

    async def _poll_loop(self) -> None:
        failures = 0
        while not self._stopping:
            try:
                work = await self.transport.next_work(self.poll_wait)
                failures = 0
            except asyncio.CancelledError:
                raise
            except (NotFound, Unauthorized) as exc:
                log.warning("control plane does not know this worker (%s); re-joining", exc)
                await self._retrying(self._rejoin)
                continue
            except Exception as exc:  # noqa: BLE001 - the server may be restarting
                delay = backoff(failures)
                failures += 1
                log.warning("polling for work failed (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                continue
            for a in work.assignments:
                self._start_job(a)
            for job_id in work.cancel:
                ex = self.running.get(job_id)
                if ex is not None:
                    ex.cancel(ex.job.reason or "cancelled")

    async def _heartbeat_loop(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self.heartbeat_interval)
            with contextlib.suppress(Exception):
                await self.transport.heartbeat()

    async def _retrying(self, fn) -> None:  # type: ignore[no-untyped-def]
        attempt = 0
        while not self._stopping:
            try:
                await fn()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001
                delay = backoff(attempt)
                attempt += 1
                log.warning("%s failed (%s); retrying in %.1fs", fn.__name__, exc, delay)
                await asyncio.sleep(delay)

    def _start_job(self, a: JobAssignment) -> None:
        if a.job.id in self.running:
            return
        ex = JobExecutor(a, self.transport, self.config)
        self.running[a.job.id] = ex
        task = asyncio.create_task(self._run_job(ex))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_job(self, ex: JobExecutor) -> None:
        job_id = ex.job.id
        try:
            report = await ex.run()
            await self._deliver(job_id, report)
        finally:
            self.running.pop(job_id, None)
            await asyncio.to_thread(ex.cleanup)

    async def _deliver(self, job_id: str, report: FinishReport) -> None:
        """Report a result until the control plane has it: a finished job's result is never lost."""
        attempt = 0
        while True:
            try:
                await self.transport.report_finished(job_id, report)
                return
            except (Conflict, NotFound) as exc:
                log.info("result of job %s not needed any more: %s", job_id, exc)
                return
            except GPUlayerError as exc:
                if exc.status < 500 and exc.status != 401:
                    log.error("control plane refused the result of %s: %s", job_id, exc)
                    return
            except Exception as exc:  # noqa: BLE001 - server unreachable: keep trying
                log.warning("reporting job %s failed (%s); will retry", job_id, exc)
            await asyncio.sleep(backoff(attempt))
            attempt += 1
