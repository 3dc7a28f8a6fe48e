"""A session's ranks on its worker (ADR 0019): their processes' life, from start to stop.

:class:`SessionRanks` is the part of the session's executor
(:class:`~gpulayer_kernel.worker.sessions.executor.SessionExecutor`) that keeps one process per
local rank (``worker/sessions/host.py``: IPython's shell), forked from the worker's *session* warm
runner (IPython and torch imported, CUDA not initialised), each behind a supervisor in its own
process group, with a socket to the executor. It starts them (and the process group a multi-node
session meets in) and waits until each says ready, reads each rank's frames for its life (output,
cell ends, its exit), marks the session *broken* when a rank dies under it, and stops them: asked,
then SIGTERM to the group, then killed. A restart is a stop and a start (the ranks' state is lost).
The cells they run are ``cells.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...clock import Clock
from ...contracts import Job, JobAssignment, SessionReport
from ...errors import GPUlayerError
from ...job import CONTROL_ENV, JOB_ID_ENV, OUTPUT_ENV, RESULT_ENV
from ...redact import Redactor
from ...runner import SESSION_ENTRYPOINT
from .. import reaper
from ..config import ExecutorConfig
from ..control import ControlReader
from ..env import base_env, job_env
from ..exits import describe_exit
from ..jobproc import PACKAGE_ROOT
from ..launch import Launch, device_env
from ..logship import LogShipper, Stream, pump_stream
from ..processes import Spawned, group_alive, killpg, spawn_cold
from ..transport import Transport
from ..warm import WarmRunner
from .output import RankOutput
from .wire import encode_frame, read_frame

START_TIMEOUT = 120.0  # seconds for every rank to say ready (imports, the process group)
EXIT_WAIT = 1.0  # seconds a rank gets to leave on its own when the session ends


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


class SessionRanks:
    """One session's rank processes on this worker; ``SessionExecutor`` builds on it."""

    # Set by ``SessionExecutor.__init__``.
    a: JobAssignment
    job: Job
    transport: Transport
    config: ExecutorConfig
    warm: WarmRunner | None
    clock: Clock
    redactor: Redactor
    shipper: LogShipper
    launch: Launch
    nproc: int
    world_size: int
    rank_base: int
    ranks: list[Rank]
    dir: Path
    cwd: Path
    scoped: dict[str, str]
    broken: str | None
    cell: int | None
    output: RankOutput
    _control: ControlReader | None
    _cancel: asyncio.Event
    _restarting: asyncio.Event

    def system(self, text: str) -> None:
        self.shipper.add("system", text)

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
            "PYTHONPATH": PACKAGE_ROOT,
        }
        if master is not None:
            gl_env["MASTER_ADDR"], gl_env["MASTER_PORT"] = master[0], str(master[1])
        gl_env.update(device_env(self.a))
        gl_env.update(self.scoped)  # the control plane that placed it (ADR 0022)
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
        cwd = self.cwd  # the workspace (ADR 0022), or the session's own folder
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

    def _rank_ids(self) -> list[int]:
        return list(range(self.rank_base, self.rank_base + self.nproc))


class _CellLines:
    """What ``pump_stream`` ships to: a rank's fd-level lines, tagged with the running cell."""

    def __init__(self, ex: SessionRanks, rank: int) -> None:
        self.ex = ex
        self.rank = rank
        self.redactor = ex.redactor

    def add(self, stream: Stream, text: str, rank: int | None = None, *, ends: bool = True) -> None:
        self.ex.shipper.add(stream, text, self.rank, self.ex.cell, ends=ends)


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
