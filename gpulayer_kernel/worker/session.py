"""A session on its worker (ADR 0019): its ranks' processes, its cells, interrupts and restarts.

The agent makes one :class:`SessionExecutor` per assignment of a session's job, in place of a
:class:`~gpulayer_kernel.worker.executor.JobExecutor`, with the same life: ``run()`` returns the
job's :class:`FinishReport` when the session ends (stopped, idle, broken beyond use), ``cancel``
ends it. In between it keeps one process per local rank (``worker/session_host.py``: IPython's
shell), forked from the worker's *session* warm runner (IPython and torch imported, CUDA not
initialised), each behind a supervisor in its own process group, with a socket to this executor.

Cells come from the control plane one at a time (``Work.cells``) and run on every local rank at
once. Output frames become the session's log records (tagged with the cell, redacted here and
again on the control plane); the end of a cell is one :class:`CellReport` with each rank's outcome
and the last output records, so a short cell costs one report. When one rank fails, the others
are interrupted (SIGINT to their process groups: ``KeyboardInterrupt`` in the cell) and the first
failure is the root cause; a rank that does not stop within ``STOP_GRACE`` (it waits in a
collective for the failed one) or dies leaves the session *broken*: further cells are refused with
the reason until ``restart`` kills every rank and starts them again (their state is lost).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..clock import SYSTEM_CLOCK, Clock
from ..contracts import (
    CellAssignment,
    CellReport,
    FinishReport,
    JobAssignment,
    LogLine,
    RankOutcome,
    SessionReport,
)
from ..contracts.limits import CELL_OUTPUT_CAP, CELL_OUTPUT_LINES, MAX_LINES
from ..errors import GPUlayerError
from ..job import CONTROL_ENV, JOB_ID_ENV, OUTPUT_ENV, RESULT_ENV
from ..redact import Redactor
from ..runner import SESSION_ENTRYPOINT
from . import reaper
from .config import ExecutorConfig
from .control import ControlReader
from .env import base_env, job_env
from .exits import describe_exit
from .launch import Launch, device_env
from .logship import LogShipper, Stream, pump_stream
from .ports import PortReservations
from .processes import Spawned, group_alive, killpg, spawn_cold
from .session_output import RankOutput
from .session_wire import encode_frame, read_frame
from .transport import Transport
from .warm import WarmRunner

log = logging.getLogger("gpulayer.worker")

START_TIMEOUT = 120.0  # seconds for every rank to say ready (imports, the process group)
STOP_GRACE = 5.0  # seconds the other ranks get to stop after one failed, before it is broken
EXIT_WAIT = 1.0  # seconds a rank gets to leave on its own when the session ends
# How a cell of the control plane's previous life ends when its result cannot be sent again.
RESTARTED_WHILE_RAN = (
    "the control plane restarted while this cell ran; its output up to then is above"
)
NEVER_CAME = (
    "the control plane restarted before this cell reached its session: it did not run; run it again"
)
_STOP = "stop"  # queue items besides cells: the session ends, or restarts
_RESTART = "restart"


@dataclass
class Rank:
    """One local rank: its process (pgid == pid: its supervisor) and its socket."""

    rank: int
    local: int
    proc: Spawned
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    pumps: list[asyncio.Task[None]] = field(default_factory=list)
    frames: asyncio.Task[None] | None = None
    done: asyncio.Future[dict[str, Any]] | None = None  # the running cell's end
    exited: str | None = None  # why its process is gone


class SessionBroken(GPUlayerError):
    code = "session_broken"
    status = 409


class SessionExecutor:
    """One session's ranks on this worker, for one attempt of its job."""

    def __init__(
        self,
        assignment: JobAssignment,
        transport: Transport,
        config: ExecutorConfig,
        *,
        ports: PortReservations,
        warm: WarmRunner | None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.a = assignment
        self.job = assignment.job
        self.transport = transport
        self.config = config
        self.warm = warm
        self.clock = clock
        self.redactor = Redactor(assignment.secrets)
        self.shipper = LogShipper(self._send_logs, self.redactor, clock=clock)
        self.launch = Launch(assignment, transport, config, self.system, ports=ports, clock=clock)
        node = assignment.node
        self.nproc = max(1, len(node.devices))
        self.world_size = self.nproc * assignment.nnodes
        self.rank_base = node.node_rank * self.nproc
        self.ranks: list[Rank] = []
        self.dir = config.work_root / "sessions" / f"{self.job.id}-{self.job.attempts}"
        if assignment.nnodes > 1:
            self.dir = self.dir.with_name(self.dir.name + f"-n{node.node_rank}")
        self.broken: str | None = None
        self.cell: int | None = None  # the cell running now (fd-level output is its)
        self._queue: asyncio.Queue[CellAssignment | str] = asyncio.Queue()
        self._cancel = asyncio.Event()
        self._cancel_reason = "stopped"
        self._restarting = asyncio.Event()  # a restart asked for: a running cell is dropped
        # Resolved by a stop or a restart while a cell runs: its wait ends at once.
        self._abort: asyncio.Future[None] | None = None
        self._interrupted = False
        self.output = RankOutput(self.shipper, self.redactor)
        self._control: ControlReader | None = None
        # What a restarted control plane asks about (``CellAssignment.resume``): the cells
        # queued here, the one being run or reported, every number taken, the last report.
        self._queued: set[int] = set()
        self._busy: int | None = None
        self._seen: set[int] = set()
        self._last: CellReport | None = None
        self._resumes: set[asyncio.Task[None]] = set()

    # -- the agent's side ------------------------------------------------------------------------

    def cancel(self, reason: str = "stopped") -> None:
        self._cancel_reason = reason
        self._cancel.set()
        self._queue.put_nowait(_STOP)
        self._drop_running_cell()

    def submit(self, cell: CellAssignment) -> None:
        if cell.resume:
            self._resume(cell)
            return
        self._queued.add(cell.number)
        self._queue.put_nowait(cell)

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
            now = self.clock.now()
            report = CellReport(
                number=n,
                ranks=[RankOutcome(rank=r, status="aborted") for r in self._rank_ids()],
                started_at=now,
                finished_at=now,
                reason=RESTARTED_WHILE_RAN if n in self._seen else NEVER_CAME,
            )
        task = asyncio.ensure_future(self._report_cell(report, remember=False))
        self._resumes.add(task)
        task.add_done_callback(self._resumes.discard)

    def restart(self) -> None:
        """Kill every rank and start them again (a running cell is aborted; state is lost)."""
        self._restarting.set()
        self._queue.put_nowait(_RESTART)
        self._drop_running_cell()

    def _drop_running_cell(self) -> None:
        if self._abort is not None and not self._abort.done():
            self._abort.set_result(None)

    def interrupt(self) -> None:
        """KeyboardInterrupt in the running cell, on every local rank (no cell: nothing)."""
        if self.cell is None:
            return
        self._interrupted = True
        for r in self.ranks:
            killpg(r.proc.pid, signal.SIGINT)

    def system(self, text: str) -> None:
        self.shipper.add("system", text)

    def cleanup(self) -> None:
        """Nothing stays on disk after its end (the agent calls this off the hot path)."""
        import shutil

        if not self.config.keep_job_dirs:
            shutil.rmtree(self.dir, ignore_errors=True)

    async def _send_logs(self, lines: list[Any]) -> None:
        await self.transport.append_logs(self.job.id, lines)

    # -- life ------------------------------------------------------------------------------------

    async def run(self) -> FinishReport:
        try:
            try:
                await self._start_ranks()
            except GPUlayerError as exc:
                self.system(f"the session could not start: {exc.message}")
                return FinishReport(state="failed", reason=f"the session could not start: {exc}")
            if self._cancel.is_set():
                return FinishReport(state="cancelled", reason=self._cancel_reason)
            await self._report_started()
            await self._serve()
            return FinishReport(state="cancelled", reason=self._cancel_reason)
        except asyncio.CancelledError:
            await self._stop_ranks()
            raise
        except Exception as exc:
            log.exception("session %s crashed its executor", self.job.id)
            return FinishReport(state="failed", reason=f"worker error: {exc!r}")
        finally:
            await self._stop_ranks()
            self.launch.close()
            if self._control is not None:
                self._control.close()
            await self.shipper.close()

    async def _report_started(self) -> None:
        try:
            await self.transport.report_started(self.job.id)
        except GPUlayerError as exc:
            self.cancel(exc.message)  # stopped or moved on between placement and start

    async def _serve(self) -> None:
        """Run cells and restarts in order until the session is stopped (no task per item:
        a stop arrives through the queue too)."""
        while not self._cancel.is_set():
            item = await self._queue.get()
            if item is _STOP:
                return
            if item is _RESTART:
                await self._restart()
            elif isinstance(item, CellAssignment):
                await self._run_cell(item)

    # -- ranks -----------------------------------------------------------------------------------

    def _env(self, local: int, master: tuple[str, int] | None) -> dict[str, str]:
        spec = self.job.spec
        out = self.dir / "output"
        rank = self.rank_base + local
        gl_env = {
            JOB_ID_ENV: self.job.id,
            "GPULAYER_JOB_NAME": spec.name,
            "GPULAYER_SESSION": self.job.id,
            "GPULAYER_ATTEMPT": str(self.job.attempts),
            OUTPUT_ENV: str(out / f"rank{rank}" if self.world_size > 1 else out),
            RESULT_ENV: str(self.dir / "result.json"),
            CONTROL_ENV: str(self.dir / "control.fifo"),
            "RANK": str(rank),
            "LOCAL_RANK": str(local),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.nproc),
            "GROUP_RANK": str(self.a.node.node_rank),
            "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        }
        if master is not None:
            gl_env["MASTER_ADDR"], gl_env["MASTER_PORT"] = master[0], str(master[1])
        gl_env.update(device_env(self.a))
        env = job_env(
            base_env(extra_allowed=self.config.extra_env_allowed),
            spec.env,
            self.a.secrets,
            gl_env,
        )
        if self.world_size > 1:
            # Share the host's cores between this node's ranks, unless the session chose.
            env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // self.nproc)))
        return env

    async def _start_ranks(self) -> None:
        """Start every local rank and wait until each says ready (or one cannot start)."""
        out = self.dir / "output"
        out.mkdir(parents=True, exist_ok=True)
        if self.world_size > 1:
            for local in range(self.nproc):
                (out / f"rank{self.rank_base + local}").mkdir(exist_ok=True)
        if self._control is None:
            self._control = ControlReader(self.dir / "control.fifo", self._report_progress)
        master: tuple[str, int] | None = None
        if self.world_size > 1:
            env: dict[str, str] = {}
            master = await self.launch.meet(env)
            extra = env
        else:
            extra = {}
        self.ranks = []
        try:
            for local in range(self.nproc):
                env = {**self._env(local, master), **extra}
                self.ranks.append(await self._spawn(local, env))
            ready = [self._ready(r) for r in self.ranks]
            if not await self.clock.wait_for(asyncio.gather(*ready), START_TIMEOUT):
                raise GPUlayerError(
                    f"the ranks did not start within {START_TIMEOUT:g}s",
                    hint="check the worker's log; a multi-node session needs every node up",
                )
        except BaseException:
            await self._stop_ranks()
            raise
        for r in self.ranks:
            r.frames = asyncio.create_task(self._frames(r))
        where = f" (node {self.a.node.node_rank} of {self.a.nnodes})" if self.a.nnodes > 1 else ""
        ranks = ", ".join(str(r.rank) for r in self.ranks)
        self.system(
            f"session up: rank{'s' if len(self.ranks) > 1 else ''} {ranks} of "
            f"{self.world_size}{where}"
            + (f", process group at {master[0]}:{master[1]}" if master else "")
        )

    async def _spawn(self, local: int, env: dict[str, str]) -> Rank:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        cwd = self.dir
        proc: Spawned | None = None
        try:
            if self.warm is not None and self.config.warm_runner:
                proc = await self.warm.spawn(SESSION_ENTRYPOINT, cwd, env, stdin=theirs.fileno())
            if proc is None:
                argv = [self.config.python, "-m", "gpulayer_kernel.runner", SESSION_ENTRYPOINT]
                proc = await spawn_cold(argv, cwd, env, stdin=theirs.fileno())
        finally:
            theirs.close()
        reader, writer = await asyncio.open_unix_connection(sock=ours, limit=1 << 20)
        rank = Rank(self.rank_base + local, local, proc, reader, writer)
        assert proc.stdout is not None and proc.stderr is not None
        rank.pumps = [
            asyncio.create_task(pump_stream(proc.stdout, "stdout", _CellLines(self, rank.rank))),
            asyncio.create_task(pump_stream(proc.stderr, "stderr", _CellLines(self, rank.rank))),
        ]
        return rank

    async def _ready(self, r: Rank) -> None:
        frame = await read_frame(r.reader)
        if frame is None:
            code = await r.proc.wait()
            await asyncio.gather(*r.pumps, return_exceptions=True)
            raise GPUlayerError(
                f"rank {r.rank} {describe_exit(code)} while starting",
                hint="its log above has what it printed",
            )
        if "fatal" in frame:
            for line in frame.get("traceback") or []:
                for text in str(line).rstrip("\n").split("\n"):
                    self.shipper.add("stderr", text, r.rank)
            raise GPUlayerError(f"rank {r.rank}: {frame['fatal']}")

    async def _frames(self, r: Rank) -> None:
        """Read one rank's frames for its life: output, cell ends, and its exit."""
        while True:
            frame = await read_frame(r.reader)
            if frame is None:
                break
            if "out" in frame:
                for line in self.output.lines(r.rank, int(frame["out"]), frame.get("items") or []):
                    self.shipper.add_line(line)
            elif "done" in frame and r.done is not None and not r.done.done():
                r.done.set_result(frame)
        code = await r.proc.wait()
        r.exited = describe_exit(code, subject=f"rank {r.rank}")
        if r.done is not None and not r.done.done():
            r.done.set_result({"done": self.cell, "status": "aborted", "exited": r.exited})
        stopped_by_us = r not in self.ranks  # ``_stop_ranks`` took it: a stop or a restart
        if not (self._cancel.is_set() or stopped_by_us) and self.broken is None:
            self._broke(f"{r.exited}; the session's state is gone with it")
            if self.cell is None:
                await self._report_session("broken", self.broken)

    def _broke(self, why: str) -> None:
        if self.broken is None:
            self.broken = why
            self.system(f"the session is broken: {why}; restart it to go on")

    async def _stop_ranks(self) -> None:
        """End every rank: ask, then SIGTERM its group, then kill what is left."""
        ranks, self.ranks = self.ranks, []
        for r in ranks:
            with contextlib.suppress(Exception):
                r.writer.write(encode_frame({"op": "exit"}))
        await _within(
            self.clock, asyncio.gather(*(r.proc.wait() for r in ranks)), EXIT_WAIT if ranks else 0
        )
        for r in ranks:
            pgid = r.proc.pid
            if r.proc.returncode is None and group_alive(pgid):
                killpg(pgid, signal.SIGTERM)
        await _within(
            self.clock,
            asyncio.gather(*(r.proc.wait() for r in ranks)),
            self.config.kill_grace if ranks else 0,
        )
        for r in ranks:
            if r.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(r.proc.pid, reaper.STOP)  # the supervisor kills all below it
            killpg(r.proc.pid, signal.SIGKILL)
        for r in ranks:
            with contextlib.suppress(Exception):
                await _within(self.clock, r.proc.wait(), 5.0)
            await _within(self.clock, asyncio.gather(*r.pumps, return_exceptions=True), 2.0)
            if r.frames is not None:
                r.frames.cancel()
            r.writer.close()
            close = getattr(r.proc, "close", None)
            if close is not None:
                close()

    async def _restart(self) -> None:
        self._restarting.clear()
        self.system("restarting the session: every rank is stopped and started again")
        await self._stop_ranks()
        self.launch.close()
        self.broken = None
        try:
            await self._start_ranks()
        except GPUlayerError as exc:
            self._broke(f"the restart failed: {exc.message}")
            await self._report_session("broken", self.broken)
            return
        await self._report_session("ready", None)

    async def _report_session(self, status: str, reason: str | None) -> None:
        report = SessionReport(status=status, reason=reason)
        with contextlib.suppress(GPUlayerError):
            await self.transport.report_session(self.job.id, report)

    async def _report_progress(self, fields: dict[str, Any]) -> None:
        await self.transport.report_progress(self.job.id, self.redactor.redact_json(fields))

    # -- cells -----------------------------------------------------------------------------------

    async def _run_cell(self, ca: CellAssignment) -> None:
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
        started = self.clock.now()
        if self.broken is not None:
            await self._report_cell(
                CellReport(
                    number=n,
                    ranks=[RankOutcome(rank=r, status="aborted") for r in self._rank_ids()],
                    broken=self.broken,
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
                path = self.dir / f"in-{n}.safetensors"
                data = await self.transport.fetch_blob(req.inputs_blob)
                await asyncio.to_thread(path.write_bytes, data)
                request["inputs_path"] = str(path)
        except GPUlayerError as exc:
            reason = f"the cell's inputs could not be fetched: {exc.message}"
        self.cell, self._interrupted = n, False
        frames: dict[int, dict[str, Any]] = {}
        if reason is None:
            loop = asyncio.get_running_loop()
            for r in self.ranks:
                r.done = loop.create_future()
                one = dict(request, value=r.rank == 0 or req.all_ranks)
                if r.rank == 0 and req.outputs:
                    one["outputs"] = list(req.outputs)
                    one["outputs_path"] = str(self.dir / f"out-{n}.safetensors")
                r.writer.write(encode_frame(one))
            frames = await self._await_ranks()
            if self._restarting.is_set():
                reason = "the session was restarted while this cell ran; its state is gone"
            elif self._cancel.is_set():
                reason = "the session was stopped while this cell ran"
        self.cell = None
        report = await self._report_of(n, frames, started, reason)
        await self._report_cell(report)

    async def _await_ranks(self) -> dict[int, dict[str, Any]]:
        """Every rank's done frame; the first failure interrupts the rest, who get a grace."""
        loop = asyncio.get_running_loop()
        pending = {r.rank: r for r in self.ranks}
        frames: dict[int, dict[str, Any]] = {}
        deadline: float | None = None
        self._abort = abort = loop.create_future()
        while pending and not abort.done():
            futures = [r.done for r in pending.values() if r.done is not None]
            left = None if deadline is None else max(0.0, deadline - self.clock.monotonic())
            await self.clock.wait_for(_first_of([*futures, abort]), left)
            for rank, r in list(pending.items()):
                if r.done is not None and r.done.done():
                    frames[rank] = r.done.result()
                    del pending[rank]
            failed = [f for f in frames.values() if f.get("status") != "ok"]
            if pending and failed and deadline is None:
                # One rank failed: the others are interrupted (it is the root cause).
                deadline = self.clock.monotonic() + STOP_GRACE
                for r in pending.values():
                    killpg(r.proc.pid, signal.SIGINT)
            elif deadline is not None and self.clock.monotonic() >= deadline:
                break
        self._abort = None
        if pending and not (self._cancel.is_set() or self._restarting.is_set()):
            first = _root_cause(frames)
            who = f"rank {first}" if first is not None else "another rank"
            many = len(pending) > 1
            stuck = ", ".join(str(r) for r in sorted(pending))
            # Said in the cell that broke it (``CellRun.broken``), not only by the next one.
            self._broke(
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
        lines: list[LogLine] = []
        outcomes: list[RankOutcome] = []
        outputs: dict[str, Any] = {}
        blob: str | None = None
        dropped = [0, 0]  # lines and bytes the ranks dropped past the cell's cap
        for rank in sorted(frames):
            f = frames[rank]
            lines += self.output.lines(rank, n, f.get("items") or [])
            lines += self.output.flush(rank, n)
            for i, count in enumerate(list(f.get("dropped") or ())[:2]):
                dropped[i] += int(count)
            if f.get("broken"):
                self._broke(str(f["broken"]))
            if f.get("exited"):
                reason = reason or str(f["exited"])
            outcomes.append(self.output.outcome(rank, f))
            if rank == 0:
                reason = reason or f.get("outputs_error")
                outputs = f.get("outputs") or {}
                path = f.get("outputs_path")
                if path:
                    try:
                        data = await asyncio.to_thread(Path(path).read_bytes)
                        blob = await self.transport.put_blob(data)
                    except (OSError, GPUlayerError) as exc:
                        reason = reason or f"the cell's --out values could not be sent: {exc}"
        # fd-level output still on its way goes first; what is left rides with the report.
        lines = [*await self.shipper.settle(), *self.shipper.fit(lines)]
        note = self.shipper.note(n, (dropped[0], dropped[1]))
        if note is not None:
            lines.append(note)
        if len(lines) > MAX_LINES:  # more than a report carries: the first ones go ahead
            with contextlib.suppress(GPUlayerError):
                await self.transport.append_logs(self.job.id, lines[:-MAX_LINES])
            lines = lines[-MAX_LINES:]
        return CellReport(
            number=n,
            ranks=outcomes,
            lines=lines,
            started_at=started,
            finished_at=self.clock.now(),
            outputs=self.redactor.redact_json(outputs),
            outputs_blob=blob,
            broken=self.broken,
            reason=reason,
        )

    def _rank_ids(self) -> list[int]:
        return list(range(self.rank_base, self.rank_base + self.nproc))

    async def _report_cell(self, report: CellReport, *, remember: bool = True) -> None:
        """Deliver a cell's end until the control plane has it (a result is never lost)."""
        if remember:
            self._last = report  # sent again if a restarted control plane asks (``resume``)
        tries = 0
        while True:
            try:
                await self.transport.report_cell(self.job.id, report)
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
                    log.info("cell %s of session %s not taken: %s", report.number, self.job.id, exc)
                    return
            except Exception as exc:
                log.warning("reporting cell %s failed (%s); will retry", report.number, exc)
            from .backoff import backoff

            await self.clock.sleep(backoff(tries))
            tries += 1
            if self._cancel.is_set() and tries > 5:
                return


class _CellLines:
    """What ``pump_stream`` ships to: a rank's fd-level lines, tagged with the running cell."""

    def __init__(self, ex: SessionExecutor, rank: int) -> None:
        self.ex = ex
        self.rank = rank
        self.redactor = ex.redactor

    def add(self, stream: Stream, text: str, rank: int | None = None) -> None:
        self.ex.shipper.add(stream, text, self.rank, self.ex.cell)


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


async def _within(clock: Clock, aw: Any, timeout: float) -> bool:
    """Await ``aw`` for at most ``timeout`` seconds of ``clock``; stop it when time runs out."""
    fut = asyncio.ensure_future(aw)
    try:
        return await clock.wait_for(fut, timeout)
    finally:
        fut.cancel()
        fut.add_done_callback(_retrieved)


def _retrieved(fut: asyncio.Future[Any]) -> None:
    # A cancelled gather ends with CancelledError as its exception: read it, so asyncio does
    # not log "exception was never retrieved".
    if not fut.cancelled():
        fut.exception()
