"""A session's cells on its worker (ADR 0019): each run on every local rank, and its report.

:class:`CellRunner`, held by the session's executor
(:class:`~gpulayer_kernel.worker.sessions.executor.SessionExecutor`) beside its rank group
(``ranks.py``), runs cells. A cell from
the control plane (``Work.cells``) runs on every local rank at once. Output frames become the
session's log records (tagged with the cell, redacted here and again on the control plane); the end
of a cell is one :class:`CellReport` with each rank's outcome and the last output records, so a
short cell costs one report, delivered until the control plane has it. When one rank fails, the
others are interrupted (SIGINT to their process groups: ``KeyboardInterrupt`` in the cell) and the
first failure is the root cause; a rank that does not stop within ``STOP_GRACE`` (it waits in a
collective for the failed one) leaves the session *broken*, said in the cell that broke it. A
restarted control plane asks how the cells of its previous life ended (``resume``): never run
again, each is reported from what this executor saw.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from pathlib import Path
from typing import Any

from ...contracts import CellAssignment, CellReport, LogLine, RankOutcome
from ...contracts.limits import CELL_OUTPUT_CAP, CELL_OUTPUT_LINES, MAX_LINES
from ...errors import GPUlayerError
from ..processes import killpg
from .attempt import SessionAttempt
from .ranks import RankGroup
from .wire import encode_frame

log = logging.getLogger("gpulayer.worker")

STOP_GRACE = 5.0  # seconds the other ranks get to stop after one failed, before it is broken
# How a cell of the control plane's previous life ends when its result cannot be sent again.
RESTARTED_WHILE_RAN = (
    "the control plane restarted while this cell ran; its output up to then is above"
)
NEVER_CAME = (
    "the control plane restarted before this cell reached its session: it did not run; run it again"
)


class CellRunner:
    """One session's cells on this worker, run on its rank group in the order they came."""

    def __init__(self, at: SessionAttempt, group: RankGroup) -> None:
        self.at = at
        self.group = group
        # Resolved by a stop or a restart while a cell runs: its wait ends at once.
        self._abort: asyncio.Future[None] | None = None
        # What a restarted control plane asks about (``CellAssignment.resume``): the cells
        # queued here, the one being run or reported, every number taken, the last report.
        self._queued: set[int] = set()
        self._busy: int | None = None
        self._seen: set[int] = set()
        self._last: CellReport | None = None
        self._resumes: set[asyncio.Task[None]] = set()

    def submit(self, cell: CellAssignment) -> None:
        if cell.resume:
            self._resume(cell)
            return
        self._queued.add(cell.number)
        self.at.queue.put_nowait(cell)

    def drop_running(self) -> None:
        """A stop or a restart: the running cell's wait ends now."""
        if self._abort is not None and not self._abort.done():
            self._abort.set_result(None)

    def interrupt(self) -> None:
        """KeyboardInterrupt in the running cell, on every local rank (no cell: nothing)."""
        if self.group.cell is not None:
            self.group.signal(signal.SIGINT)

    def _resume(self, cell: CellAssignment) -> None:
        """A restarted control plane asks how cell ``n`` of its previous life ended. Never
        runs it: a queued or running one reports when it ends, as always; an ended one sends
        its report again; one that never came here ends as not run."""
        n = cell.number
        if n in self._queued or n == self._busy:
            return
        if self._last is not None and self._last.number == n:
            report = self._last
        else:
            now = self.at.clock.now()
            report = CellReport(
                number=n,
                ranks=[RankOutcome(rank=r, status="aborted") for r in self.group.rank_ids()],
                started_at=now,
                finished_at=now,
                reason=RESTARTED_WHILE_RAN if n in self._seen else NEVER_CAME,
            )
        task = asyncio.ensure_future(self._report_cell(report, remember=False))
        self._resumes.add(task)
        task.add_done_callback(self._resumes.discard)

    async def run(self, ca: CellAssignment) -> None:
        n = ca.number
        self._queued.discard(n)
        if n in self._seen:  # handed over twice: it ran once; its report goes again
            self._resume(ca)
            return
        self._seen.add(n)
        self._busy = n
        try:
            await self._run_one(ca)
        finally:
            self._busy = None

    async def _run_one(self, ca: CellAssignment) -> None:
        n, req = ca.number, ca.request
        at, group = self.at, self.group
        started = at.clock.now()
        if group.broken is not None:
            await self._report_cell(
                CellReport(
                    number=n,
                    ranks=[RankOutcome(rank=r, status="aborted") for r in group.rank_ids()],
                    broken=group.broken,
                    started_at=started,
                    finished_at=started,
                )
            )
            return
        request: dict[str, Any] = {
            "op": "run",
            "n": n,
            "code": req.code,
            "count": req.count,
            "history": req.history,
            "inputs": req.inputs,
            "cap": [CELL_OUTPUT_CAP, CELL_OUTPUT_LINES],  # the rank drops (and counts) the rest
        }
        reason: str | None = None
        try:
            if req.inputs_blob is not None:
                path = at.dir / f"in-{n}.safetensors"
                data = await at.transport.fetch_blob(req.inputs_blob)
                await asyncio.to_thread(path.write_bytes, data)
                request["inputs_path"] = str(path)
        except GPUlayerError as exc:
            reason = f"the cell's inputs could not be fetched: {exc.message}"
        group.cell = n
        frames: dict[int, dict[str, Any]] = {}
        if reason is None:
            loop = asyncio.get_running_loop()
            for r in group.ranks:
                r.done = loop.create_future()
                one = dict(request, value=r.rank == 0 or req.all_ranks)
                if r.rank == 0 and req.outputs:
                    one["outputs"] = list(req.outputs)
                    one["outputs_path"] = str(at.dir / f"out-{n}.safetensors")
                r.writer.write(encode_frame(one))
            frames = await self._await_ranks()
            if at.restarting.is_set():
                reason = "the session was restarted while this cell ran; its state is gone"
            elif at.cancelled.is_set():
                reason = "the session was stopped while this cell ran"
        group.cell = None
        report = await self._report_of(n, frames, started, reason)
        await self._report_cell(report)

    async def _await_ranks(self) -> dict[int, dict[str, Any]]:
        """Every rank's done frame; the first failure interrupts the rest, who get a grace."""
        loop = asyncio.get_running_loop()
        clock = self.at.clock
        pending = {r.rank: r for r in self.group.ranks}
        frames: dict[int, dict[str, Any]] = {}
        deadline: float | None = None
        self._abort = abort = loop.create_future()
        while pending and not abort.done():
            futures = [r.done for r in pending.values() if r.done is not None]
            left = None if deadline is None else max(0.0, deadline - clock.monotonic())
            any_done = _first_of([*futures, abort])
            if left is None:
                await any_done  # its own future (no one else's to cancel): a loop turn less
            else:
                await clock.wait_for(any_done, left)
            for rank, r in list(pending.items()):
                if r.done is not None and r.done.done():
                    frames[rank] = r.done.result()
                    del pending[rank]
            failed = [f for f in frames.values() if f.get("status") != "ok"]
            if pending and failed and deadline is None:
                # One rank failed: the others are interrupted (it is the root cause).
                deadline = clock.monotonic() + STOP_GRACE
                for r in pending.values():
                    killpg(r.proc.pid, signal.SIGINT)
            elif deadline is not None and clock.monotonic() >= deadline:
                break
        self._abort = None
        if pending and not (self.at.cancelled.is_set() or self.at.restarting.is_set()):
            first = _root_cause(frames)
            who = f"rank {first}" if first is not None else "another rank"
            many = len(pending) > 1
            stuck = ", ".join(str(r) for r in sorted(pending))
            # Said in the cell that broke it (``CellRun.broken``), not only by the next one.
            self.group.broke(
                f"{who} failed first (the root cause); rank{'s' if many else ''} {stuck} "
                f"did not stop within {STOP_GRACE:g}s after it: {'they are' if many else 'it is'} "
                f"stuck in a collective waiting for {who}, so the session is broken"
            )
        for rank in pending:
            frames[rank] = {"status": "aborted"}
        return frames

    async def _report_of(
        self,
        n: int,
        frames: dict[int, dict[str, Any]],
        started: float,
        reason: str | None,
    ) -> CellReport:
        at, group = self.at, self.group
        lines: list[LogLine] = []
        outcomes: list[RankOutcome] = []
        outputs: dict[str, Any] = {}
        blob: str | None = None
        dropped = [0, 0]  # lines and bytes the ranks dropped past the cell's cap
        for rank in sorted(frames):
            f = frames[rank]
            lines += group.output.lines(rank, n, f.get("items") or [])
            lines += group.output.flush(rank, n)
            for i, count in enumerate(list(f.get("dropped") or ())[:2]):
                dropped[i] += int(count)
            if f.get("broken"):
                group.broke(str(f["broken"]))
            if f.get("exited"):
                reason = reason or str(f["exited"])
            outcomes.append(group.output.outcome(rank, f))
            if rank == 0:
                reason = reason or f.get("outputs_error")
                outputs = f.get("outputs") or {}
                path = f.get("outputs_path")
                if path:
                    try:
                        data = await asyncio.to_thread(Path(path).read_bytes)
                        blob = await at.transport.put_blob(data)
                    except (OSError, GPUlayerError) as exc:
                        reason = reason or f"the cell's --out values could not be sent: {exc}"
        # fd-level output still on its way goes first; what is left rides with the report.
        lines = [*await at.shipper.settle(), *at.shipper.fit(lines)]
        note = at.shipper.note(n, (dropped[0], dropped[1]))
        if note is not None:
            lines.append(note)
        if len(lines) > MAX_LINES:  # more than a report carries: the first ones go ahead
            with contextlib.suppress(GPUlayerError):
                await at.transport.append_logs(at.job.id, lines[:-MAX_LINES])
            lines = lines[-MAX_LINES:]
        return CellReport(
            number=n,
            ranks=outcomes,
            lines=lines,
            started_at=started,
            finished_at=at.clock.now(),
            outputs=at.redactor.redact_json(outputs),
            outputs_blob=blob,
            broken=group.broken,
            reason=reason,
        )

    async def _report_cell(self, report: CellReport, *, remember: bool = True) -> None:
        """Deliver a cell's end until the control plane has it (a result is never lost)."""
        if remember:
            self._last = report  # sent again if a restarted control plane asks (``resume``)
        at = self.at
        tries = 0
        while True:
            try:
                await at.transport.report_cell(at.job.id, report)
                return
            except GPUlayerError as exc:
                if exc.status in (400, 413, 422) and (report.lines or report.outputs):
                    # Refused for what it carries: its end goes without it (never a frozen cell).
                    why = f"the cell's output was not taken: {exc.message}"[:20_000]
                    report = report.model_copy(
                        update={"lines": [], "outputs": {}, "outputs_blob": None, "reason": why}
                    )
                    continue
                if exc.status < 500 and exc.status != 401:
                    log.info("cell %s of session %s not taken: %s", report.number, at.job.id, exc)
                    return
            except Exception as exc:
                log.warning("reporting cell %s failed (%s); will retry", report.number, exc)
            from ..backoff import backoff

            await at.clock.sleep(backoff(tries))
            tries += 1
            if at.cancelled.is_set() and tries > 5:
                return


def _first_of(futures: list[asyncio.Future[Any]]) -> asyncio.Future[None]:
    """A future that resolves when the first of ``futures`` does (made without a task)."""
    first: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def settle(_: object) -> None:
        if not first.done():
            first.set_result(None)

    for f in futures:
        f.add_done_callback(settle)
    return first


def _root_cause(frames: dict[int, dict[str, Any]]) -> int | None:
    """The first rank (lowest) whose failure is not an interrupt we sent it."""
    failed = [r for r, f in sorted(frames.items()) if f.get("status") == "error"]
    real = [r for r in failed if (frames[r].get("error") or {}).get("ename") != "KeyboardInterrupt"]
    first = real or failed
    return first[0] if first else None
