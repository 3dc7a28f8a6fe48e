"""The worker agent: joins a control plane, long-polls for work, runs jobs, reports back.

One agent, any transport (ADR 0003): the embedded default hands it an ``InProcessTransport``;
``gpulayer worker`` hands it an ``HttpTransport``. Waiting for work is a long-poll that the control
plane answers the moment a job is assigned (ADR 0016); the only sleeps are retry backoffs.

The agent owns what its jobs share on this machine: its warm runner (the zygotes its jobs fork
from, with Python jobs' processes forked ahead of time), its bundle cache, its rendezvous port
reservations, and its :class:`~gpulayer_kernel.worker.reports.Reporter`, through which every
job's start, lines, progress and end travel, merged per attempt and batched across jobs. Every wait
(heartbeats, backoffs, the job timeouts of its executors) runs on one
:class:`~gpulayer_kernel.clock.Clock`, so tests drive them with ``FakeClock``.

What it runs is keyed by (job id, attempt). An assignment of an attempt it runs, or ran to the end
lately, is a duplicate (a redelivery after a restart) and is ignored: an attempt runs once. A
newer attempt of a job it still runs supersedes the old one, which is stopped; so is an attempt
the control plane lists as stale (``Work.stop``) or refuses a report of (an ``AttemptTransport``
tells the agent): its process is stopped and its reports dropped, as no crash.

Its loops retry only what passes (``transient``: the control plane unreachable, restarting, busy,
a timeout); a worker the control plane forgot re-joins. Anything else ends the loops with one
clear error (``fatal``) and ``wait()`` returns: a token refused at re-join (revoked: the machine
it ran on was ended), a refusal (4xx), a bug (``TypeError``). ``gpulayer worker`` then leaves
and exits 1 instead of retrying forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, cast

from ..clock import SYSTEM_CLOCK, Clock
from ..contracts import FinishReport, JobAssignment, Work, WorkerInfo, WorkerRegistration
from ..errors import Conflict, GPUlayerError, NotFound, Unauthorized
from .backoff import backoff
from .bundlecache import BundleCache
from .config import ExecutorConfig
from .executor import JobExecutor
from .ports import PortReservations
from .processes import reap_leftovers
from .reports import Reporter
from .running import Executor, Steered
from .sessions.executor import SessionExecutor
from .transport import AttemptTransport, Transport
from .warm import WarmRunner, session_preload, warm_sessions

if TYPE_CHECKING:
    from .sessions.kernel import KernelExecutor

__all__ = ["WorkerAgent", "backoff"]  # backoff: re-exported for the CLI's join loop

log = logging.getLogger("gpulayer.worker")

Attempt = tuple[str, int]  # (job id, attempt)
# Attempts remembered after they ran to the end, so a late duplicate of one is not run again.
DONE_KEPT = 4_096
# A job killed by one of these, not by us, may have got the signal its machine's end sent to
# every process at once (Slurm's scancel, a preemption): wait this long for the worker's own
# before reporting it failed, so that it is reported stopped with its worker (and may retry).
SHUTDOWN_SIGNALS = frozenset(
    128 + s for s in (signal.SIGTERM, signal.SIGKILL, signal.SIGHUP, signal.SIGINT)
)
SIGNAL_GRACE = 2.0
# Leaving is a courtesy (the server counts a silent worker lost at its heartbeat timeout): the
# last reports get this long to go out, the goodbye this long, so SIGTERM ends an idle worker
# within a few seconds even when its server is unreachable.
REPORTS_GRACE = 10.0
LEAVE_GRACE = 2.0


def transient(exc: BaseException) -> bool:
    """A failure that may pass by itself: retried with backoff (the rest ends the loops)."""
    if isinstance(exc, GPUlayerError):
        return exc.status >= 500 or exc.status == 429  # unreachable, restarting, busy
    return isinstance(exc, (ConnectionError, TimeoutError))


class WorkerAgent:
    """One worker: joins, heartbeats, long-polls for work, runs each job, reports back."""

    def __init__(
        self,
        transport: Transport,
        registration: WorkerRegistration,
        config: ExecutorConfig,
        *,
        clock: Clock = SYSTEM_CLOCK,
        heartbeat_interval: float = 5.0,
        poll_wait: float = 25.0,
    ) -> None:
        self.transport = transport
        self.registration = registration
        # Its one-shot jobs' workspaces are decided from what it declares (ADR 0022).
        if config.shares is None and registration.shares is not None:
            config = dataclasses.replace(config, shares=registration.shares)
        self.config = config
        self.clock = clock
        self.heartbeat_interval = heartbeat_interval
        self.poll_wait = poll_wait
        # What this worker's jobs share, owned here so that two workers in one process (tests,
        # the embedded default beside a served one) never share a zygote or a port.
        self.warm_runner = WarmRunner(config, clock)
        # Sessions fork from a zygote of their own, with IPython (and torch) imported: forking a
        # torch-loaded process costs one-shot jobs ~40 ms they need not pay (ADR 0019).
        self.session_runner = WarmRunner(config, clock, preload=session_preload)
        self.ports = PortReservations()
        self.bundles = BundleCache(config.work_root / "bundles", config.bundle_cache_bytes)
        self.reporter = Reporter(transport.report, clock=clock, linger=config.report_linger)
        self.info: WorkerInfo | None = None
        self.running: dict[Attempt, Executor] = {}
        self._done: OrderedDict[Attempt, None] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loops: list[asyncio.Task[None]] = []
        self._stopping = False
        self._stopped = False
        self._stopping_now: asyncio.Future[None] | None = None  # set when stop() begins
        self.joined = asyncio.Event()
        self.fatal: str | None = None  # why the loops ended by themselves (``_give_up``)

    async def start(self) -> WorkerInfo:
        killed = await asyncio.to_thread(reap_leftovers, self.config.work_root)
        if killed:
            log.warning("stopped %d process(es) left by jobs of a crashed worker", len(killed))
        self.info = await self.transport.register(self.registration)
        self.joined.set()
        if warm_sessions(self.config.warm_sessions, self.registration.capabilities):
            self.session_runner.prewarm()
        self._loops = [
            asyncio.create_task(self._poll_loop()),
            asyncio.create_task(self._heartbeat_loop()),
        ]
        return self.info

    async def wait(self) -> None:
        """Until the loops end: ``stop()``, or a failure that retrying cannot mend (``fatal``)."""
        await asyncio.gather(*self._loops, return_exceptions=True)

    def _give_up(self, why: str, exc: BaseException) -> None:
        """A failure retrying cannot mend: say so once, clearly, and end the loops."""
        if self.fatal is not None:
            return
        self.fatal = f"{why}: {exc}" if str(exc) else f"{why}: {type(exc).__name__}"
        hint = getattr(exc, "hint", "") or ""
        log.error(
            "%s; this worker stops%s",
            self.fatal,
            f" ({hint})" if hint else "",
            exc_info=None if isinstance(exc, GPUlayerError) else exc,
        )
        self._stopping = True
        current = asyncio.current_task()
        for t in self._loops:
            if t is not current:
                t.cancel()

    async def stop(self, reason: str = "the worker is shutting down") -> None:
        """Stop taking work, stop running jobs (their reports are sent), then leave.

        Idempotent. Whatever happens on the way (a cancel, a transport error), the warm runner
        is closed and its process reaped before this returns or raises.
        """
        if self._stopped:
            return
        self._stopped = self._stopping = True
        if self._stopping_now is not None and not self._stopping_now.done():
            self._stopping_now.set_result(None)
        try:
            for t in self._loops:
                t.cancel()
            for ex in list(self.running.values()):
                ex.cancel(reason)
            if self._tasks:
                finishing = asyncio.gather(*self._tasks, return_exceptions=True)
                await self.clock.wait_for(finishing, self.config.kill_grace + 10)
        finally:
            self.warm_runner.close()  # the warm runners go with their worker
            self.session_runner.close()
        await self._at_most(self.reporter.close(), REPORTS_GRACE)
        await self._at_most(self.transport.deregister(), LEAVE_GRACE)
        await self.transport.close()

    async def _at_most(self, step: Awaitable[None], seconds: float) -> None:
        """Run one step of leaving for at most ``seconds``; cancelled after, errors dropped.

        A server that is gone or hung would otherwise hold the stopping worker for a whole
        request timeout (30 s) or failover window.
        """
        task = asyncio.ensure_future(step)
        with contextlib.suppress(Exception):
            await self.clock.wait_for(task, seconds)
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task

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
                await self._retrying(self._rejoin, "re-joining the control plane")
                continue
            except Exception as exc:
                if not transient(exc):
                    self._give_up("polling for work was refused", exc)
                    return
                delay = backoff(failures)
                failures += 1
                log.warning("polling for work failed (%s); retrying in %.1fs", exc, delay)
                await self.clock.sleep(delay)
                continue
            self._take(work)

    async def _heartbeat_loop(self) -> None:
        failing = False
        while not self._stopping:
            await self.clock.sleep(self.heartbeat_interval)
            try:
                await self.transport.heartbeat()
            except asyncio.CancelledError:
                raise
            except GPUlayerError as exc:
                # 401/404: the poll loop re-joins; 5xx: passes. Said once per run of failures.
                if not failing:
                    log.warning("heartbeat failed (%s); the control plane may count it lost", exc)
                failing = True
                continue
            except Exception as exc:
                if not transient(exc):
                    self._give_up("sending a heartbeat failed", exc)
                    return
                if not failing:
                    log.warning("heartbeat failed (%s); retrying", exc)
                failing = True
                continue
            if failing:
                log.info("heartbeats are answered again")
            failing = False

    async def _retrying(self, fn: Callable[[], Awaitable[None]], what: str) -> None:
        """``fn`` until it succeeds, retrying what passes; what does not ends the loops (a
        re-join refused: the token was revoked or expired, as when its machine was ended)."""
        attempt = 0
        while not self._stopping:
            try:
                await fn()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not transient(exc):
                    self._give_up(f"{what} was refused", exc)
                    return
                delay = backoff(attempt)
                attempt += 1
                log.warning("%s failed (%s); retrying in %.1fs", what, exc, delay)
                await self.clock.sleep(delay)

    def _take(self, work: Work) -> None:
        """Start new attempts, then stop what the control plane asks to stop."""
        for a in work.assignments:
            self._start_job(a)
        for job_id in work.cancel:
            for (held, _), ex in list(self.running.items()):
                if held == job_id:
                    ex.cancel(ex.job.reason or "cancelled")
        for ref in work.stop:
            self._stale((ref.job_id, ref.attempt))
        for cell in work.cells:
            session = self._session(cell.session_id)
            if isinstance(session, SessionExecutor):
                session.submit(cell)
            else:  # a GPU kernel takes no cells: its Jupyter host talks to the kernel
                log.warning(
                    "cell %s for session %s, which does not run here", cell.number, cell.session_id
                )
        for session_id in work.interrupts:
            if (s := self._session(session_id)) is not None:
                s.interrupt()
        for session_id in work.restarts:
            if (s := self._session(session_id)) is not None:
                s.restart()

    def _session(self, job_id: str) -> Steered | None:
        """The newest attempt of a session (or GPU kernel) running here."""
        found = [(a, ex) for (j, a), ex in self.running.items() if j == job_id]
        ex = max(found, key=lambda p: p[0])[1] if found else None
        return None if ex is None or isinstance(ex, JobExecutor) else cast(Steered, ex)

    def _stale(self, key: Attempt) -> None:
        """The control plane moved on from this attempt: stop its process; its reports drop."""
        ex = self.running.get(key)
        if ex is not None:
            ex.cancel(f"attempt {key[1]} of job {key[0]} is stale; stopped")

    def _start_job(self, a: JobAssignment) -> None:
        key = (a.job.id, a.attempt)
        if key in self.running or key in self._done:
            return  # a duplicate (redelivered after a restart): an attempt runs once
        for (job_id, attempt), old in list(self.running.items()):
            if job_id != a.job.id:
                continue
            if attempt > a.attempt:
                return  # an older attempt than the one running here: stale on arrival
            old.cancel(f"superseded by attempt {a.attempt}")
        moved_on = lambda: self._stale(key)  # noqa: E731
        ex: Executor
        if a.job.spec.is_session:
            # A session's lines and cell reports keep their own order: not through the reporter.
            # A GPU kernel (ADR 0021) is a session whose rank is an ipykernel, relayed.
            executor: type[SessionExecutor | KernelExecutor] = SessionExecutor
            if getattr(a.job.spec.workload, "kernel", False):
                # Imported here: most workers never run a kernel; every `gpulayer run` starts one.
                from .sessions.kernel import KernelExecutor

                executor = KernelExecutor
            ex = executor(
                a,
                AttemptTransport(self.transport, a.attempt, moved_on),
                self.config,
                ports=self.ports,
                warm=self.session_runner,
                clock=self.clock,
            )
        else:
            ex = JobExecutor(
                a,
                AttemptTransport(self.transport, a.attempt, moved_on, self.reporter),
                self.config,
                ports=self.ports,
                warm=self.warm_runner,
                bundles=self.bundles,
                clock=self.clock,
            )
        self.running[key] = ex
        task = asyncio.create_task(self._run_job(key, ex))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_job(self, key: Attempt, ex: Executor) -> None:
        try:
            report = await self._with_shutdown(await ex.run())
            await self._deliver(ex, key, report.model_copy(update={"attempt": key[1]}))
        finally:
            self.running.pop(key, None)
            self._done[key] = None
            while len(self._done) > DONE_KEPT:
                self._done.popitem(last=False)
            await asyncio.to_thread(ex.cleanup)

    async def _with_shutdown(self, report: FinishReport) -> FinishReport:
        """A job killed by a shutdown signal we did not send, as the worker stops too, was
        stopped with its worker (reported ``cancelled``: the control plane, which asked for no
        cancel, counts it lost), not failed."""
        signalled = (report.reason or "").startswith("killed by")  # not a timeout of ours
        if report.state != "failed" or report.exit_code not in SHUTDOWN_SIGNALS or not signalled:
            return report
        if not self._stopping:
            if self._stopping_now is None:
                self._stopping_now = asyncio.get_running_loop().create_future()
            await self.clock.wait_for(self._stopping_now, SIGNAL_GRACE)
        if not self._stopping:
            return report
        why = f"the worker is shutting down; the job was {report.reason or 'signalled'}"
        return report.model_copy(update={"state": "cancelled", "reason": why})

    async def _deliver(self, ex: Executor, key: Attempt, report: FinishReport) -> None:
        """Report a result until the control plane has it: a finished job's result is never lost
        (a stale attempt's is refused: dropped here). A job's goes with its other reports."""
        job_id = key[0]
        tries = 0
        while True:
            try:
                if isinstance(ex, JobExecutor):
                    await self.reporter.finished(job_id, key[1], report)
                else:
                    await self.transport.report_finished(job_id, report)
                return
            except (Conflict, NotFound) as exc:
                log.info("result of job %s not needed any more: %s", job_id, exc)
                return
            except GPUlayerError as exc:
                if exc.status < 500 and exc.status != 401:
                    log.error("control plane refused the result of %s: %s", job_id, exc)
                    return
            except Exception as exc:
                log.warning("reporting job %s failed (%s); will retry", job_id, exc)
            await self.clock.sleep(backoff(tries))
            tries += 1
