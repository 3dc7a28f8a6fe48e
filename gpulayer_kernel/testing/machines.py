"""In-process machines for ``FakeProvider``: thousands of "machines" on one clock, no processes.

    machines = InProcessMachines(cp, tokens)
    provider = FakeProvider(settings, clock=clock, start_machine=machines.start)

Each machine joins exactly as a launched worker does (its single-use instance token is checked
and spent by the same ``TokenService``, then ``ControlPlane.register`` with it), heartbeats on
the control plane's clock, and "runs" each job it is handed: a command ``sleep N`` takes N
seconds of the clock, anything else none; exit code 0 (``exit N`` as the command: code N).
Preempting it stops it dead (no goodbye, no more heartbeats); a clean stop leaves the control
plane as a worker does. What runs is fake; the control plane, tokens, ledger and autoscaler
are the real ones.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from ..contracts import (
    FinishReport,
    JobAssignment,
    Offer,
    WorkerRegistration,
)
from ..controlplane import ControlPlane
from ..errors import GPUlayerError
from ..providers.base import LaunchSpec
from ..security import TokenKind, TokenService


class InProcessMachine:
    """One fake machine's worker loop (see the module docstring)."""

    def __init__(self, cp: ControlPlane, worker_id: str, heartbeat: float) -> None:
        self.cp = cp
        self.worker_id = worker_id
        self.heartbeat = heartbeat
        self.ran: list[str] = []  # job ids it started, in order
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop = asyncio.get_running_loop().create_task(self._run())
        self._dead = False

    def alive(self) -> bool:
        return not self._dead

    async def stop(self, *, kill: bool) -> None:
        self._dead = True
        for t in [self._loop, *self._tasks]:
            t.cancel()
        await asyncio.gather(self._loop, *self._tasks, return_exceptions=True)
        if not kill:
            with contextlib.suppress(GPUlayerError):
                await self.cp.deregister(self.worker_id)

    async def _run(self) -> None:
        clock = self.cp.clock
        beats = asyncio.get_running_loop().create_task(self._beat())
        self._tasks.add(beats)
        while not self._dead:
            if not self.cp.dispatch.open:  # its control plane stopped: wait, as a worker would
                await clock.sleep(self.heartbeat)
                continue
            try:
                work = await self.cp.next_work(self.worker_id, wait=self.heartbeat)
            except GPUlayerError:
                await clock.sleep(self.heartbeat)
                continue
            for a in work.assignments:
                task = asyncio.get_running_loop().create_task(self._job(a))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            for job_id in work.cancel:
                with contextlib.suppress(GPUlayerError):
                    job = await self.cp.get(job_id)
                    report = FinishReport(state="cancelled", attempt=job.attempts)
                    await self.cp.report_finished(self.worker_id, job_id, report)

    async def _beat(self) -> None:
        while not self._dead:
            await self.cp.clock.sleep(self.heartbeat)
            with contextlib.suppress(GPUlayerError):
                await self.cp.heartbeat(self.worker_id)

    async def _job(self, a: JobAssignment) -> None:
        job = a.job
        try:
            await self.cp.report_started(self.worker_id, job.id, a.attempt)
            self.ran.append(job.id)
            argv = getattr(job.spec.workload, "argv", [])
            code = 0
            if argv[:1] == ["sleep"] and len(argv) > 1:
                await self.cp.clock.sleep(float(argv[1]))
            elif argv[:1] == ["exit"] and len(argv) > 1:
                code = int(argv[1])
            state = "succeeded" if code == 0 else "failed"
            report = FinishReport(state=state, exit_code=code, attempt=a.attempt)
            await self.cp.report_finished(self.worker_id, job.id, report)
        except GPUlayerError:
            pass  # a stale attempt, a cancelled job: a real worker drops it too


class InProcessMachines:
    """``start_machine`` for ``FakeProvider``: joins machines to ``cp`` through ``tokens``."""

    def __init__(self, cp: ControlPlane, tokens: TokenService, *, heartbeat: float = 1.0) -> None:
        self.cp = cp
        self.tokens = tokens
        self.heartbeat = heartbeat
        self.machines: dict[str, InProcessMachine] = {}  # external id -> machine

    async def start(
        self, offer: Offer, token: str, how: LaunchSpec, external_id: str
    ) -> InProcessMachine:
        from ..capabilities.simulated import simulated_capabilities

        principal = await self.tokens.authenticate(token, {TokenKind.INSTANCE, TokenKind.JOIN})
        caps = simulated_capabilities(offer.gpus, _kind(offer)) if offer.gpus else None
        labels = {**offer.labels, "gpulayer.instance": how.instance_id}
        reg = WorkerRegistration(
            name=how.worker_name,
            labels=labels,
            **({"capabilities": caps} if caps is not None else {}),
        )
        instance = principal.token_id if principal.kind == TokenKind.INSTANCE else None
        async with self.tokens.spending(principal):
            info = await self.cp.register(reg, instance_token=instance)
        machine = InProcessMachine(self.cp, info.id, self.heartbeat)
        self.machines[external_id] = machine
        return machine

    async def stop_all(self) -> None:
        """End every machine still running (a test's teardown: they live in its loop)."""
        for machine in self.machines.values():
            if machine.alive():
                await machine.stop(kill=True)


def _kind(offer: Offer) -> str:
    kind = offer.gpu_kind or "sim"
    return f"{kind}-{offer.gpu_memory >> 30}gb" if offer.gpu_memory else kind
