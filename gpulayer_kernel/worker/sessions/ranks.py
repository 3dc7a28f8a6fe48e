"""A session's ranks on its worker (ADR 0019): their processes' life, from start to stop.

:class:`RankGroup`, held by the session's executor
(:class:`~gpulayer_kernel.worker.sessions.executor.SessionExecutor`) over its attempt
(``attempt.py``), keeps one process per local rank (``worker/sessions/host.py``: IPython's shell),
forked from the worker's *session* warm runner (IPython and torch imported, CUDA not initialised),
each behind a supervisor in its own process group, with a socket to the executor. It starts them
(and the process group a multi-node session meets in) and waits until each says ready, reads each
rank's frames for its life (output, cell ends, its exit), marks the session *broken* when a rank
dies under it, and stops them: asked, then SIGTERM to the group, then killed. A restart is a stop
and a start (the ranks' state is lost). The cells they run are ``cells.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from dataclasses import dataclass, field
from typing import Any

from ...clock import Clock
from ...errors import GPUlayerError
from ...job.runner import SESSION_ENTRYPOINT
from ..control import ControlReader
from ..exits import describe_exit
from ..logship import Stream, pump_stream
from ..processes import Spawned, group_alive, killpg, spawn_cold, stop_now
from .attempt import SessionAttempt
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


class RankGroup:
    """One session's rank processes on this worker (held by its ``SessionExecutor``)."""

    def __init__(self, at: SessionAttempt) -> None:
        self.at = at
        node = at.a.node
        self.nproc = max(1, len(node.devices))
        self.world_size = self.nproc * at.a.nnodes
        self.rank_base = node.node_rank * self.nproc
        self.ranks: list[Rank] = []
        self.broken: str | None = None
        self.cell: int | None = None  # the cell running now (fd-level output is its)
        self.output = RankOutput(at.shipper, at.redactor)
        self._control: ControlReader | None = None
        at.closing.append(self._close_control)

    def _close_control(self) -> None:
        if self._control is not None:
            self._control.close()

    def signal(self, sig: int) -> None:
        for r in self.ranks:
            killpg(r.proc.pid, sig)

    def rank_ids(self) -> list[int]:
        return list(range(self.rank_base, self.rank_base + self.nproc))

    # -- ranks -----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start every local rank and wait until each says ready (or one cannot start)."""
        at = self.at
        out = at.dir / "output"
        out.mkdir(parents=True, exist_ok=True)
        if self.world_size > 1:
            for local in range(self.nproc):
                (out / f"rank{self.rank_base + local}").mkdir(exist_ok=True)
        if self._control is None:
            self._control = ControlReader(at.dir / "control.fifo", at.report_progress)
        master: tuple[str, int] | None = None
        if self.world_size > 1:
            env: dict[str, str] = {}
            master = await at.launch.meet(env)
            extra = env
        else:
            extra = {}
        self.ranks = []
        try:
            for local in range(self.nproc):
                env = at.rank_env(
                    self.rank_base + local,
                    local,
                    nproc=self.nproc,
                    world_size=self.world_size,
                    master=master,
                )
                env.update(extra)
                self.ranks.append(await self._spawn(local, env))
            ready = [self._ready(r) for r in self.ranks]
            if not await at.clock.wait_for(asyncio.gather(*ready), START_TIMEOUT):
                raise GPUlayerError(
                    f"the ranks did not start within {START_TIMEOUT:g}s",
                    hint="check the worker's log; a multi-node session needs every node up",
                )
        except BaseException:
            await self.stop()
            raise
        for r in self.ranks:
            r.frames = asyncio.create_task(self._frames(r))
        a = at.a
        where = f" (node {a.node.node_rank} of {a.nnodes})" if a.nnodes > 1 else ""
        ranks = ", ".join(str(r.rank) for r in self.ranks)
        at.system(
            f"session up: rank{'s' if len(self.ranks) > 1 else ''} {ranks} of "
            f"{self.world_size}{where}"
            + (f", process group at {master[0]}:{master[1]}" if master else "")
        )

    async def _spawn(self, local: int, env: dict[str, str]) -> Rank:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        at = self.at
        cwd = at.cwd  # the workspace (ADR 0022), or the session's own folder
        proc: Spawned | None = None
        try:
            if at.warm is not None and at.config.warm_runner:
                proc = await at.warm.spawn(SESSION_ENTRYPOINT, cwd, env, stdin=theirs.fileno())
            if proc is None:
                argv = [at.config.python, "-m", "gpulayer_kernel.job.runner", SESSION_ENTRYPOINT]
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
                    self.at.shipper.add("stderr", text, r.rank)
            raise GPUlayerError(f"rank {r.rank}: {frame['fatal']}")

    async def _frames(self, r: Rank) -> None:
        """Read one rank's frames for its life: output, cell ends, and its exit."""
        while True:
            frame = await read_frame(r.reader)
            if frame is None:
                break
            if "out" in frame:
                for line in self.output.lines(r.rank, int(frame["out"]), frame.get("items") or []):
                    self.at.shipper.add_line(line)
            elif "done" in frame and r.done is not None and not r.done.done():
                r.done.set_result(frame)
        code = await r.proc.wait()
        r.exited = describe_exit(code, subject=f"rank {r.rank}")
        if r.done is not None and not r.done.done():
            r.done.set_result({"done": self.cell, "status": "aborted", "exited": r.exited})
        stopped_by_us = r not in self.ranks  # ``stop`` took it: a stop or a restart
        if not (self.at.cancelled.is_set() or stopped_by_us) and self.broken is None:
            self.broke(f"{r.exited}; the session's state is gone with it")
            if self.cell is None:
                await self.at.report_session("broken", self.broken)

    def broke(self, why: str) -> None:
        if self.broken is None:
            self.broken = why
            self.at.system(f"the session is broken: {why}; restart it to go on")

    async def stop(self) -> None:
        """End every rank: ask, then SIGTERM its group, then kill what is left."""
        ranks, self.ranks = self.ranks, []
        clock = self.at.clock
        for r in ranks:
            with contextlib.suppress(Exception):
                r.writer.write(encode_frame({"op": "exit"}))
        await _within(
            clock, asyncio.gather(*(r.proc.wait() for r in ranks)), EXIT_WAIT if ranks else 0
        )
        for r in ranks:
            pgid = r.proc.pid
            if r.proc.returncode is None and group_alive(pgid):
                killpg(pgid, signal.SIGTERM)
        await _within(
            clock,
            asyncio.gather(*(r.proc.wait() for r in ranks)),
            self.at.config.kill_grace if ranks else 0,
        )
        for r in ranks:
            if r.proc.returncode is None:
                stop_now(r.proc)  # everything the rank started, even what left its group
            killpg(r.proc.pid, signal.SIGKILL)
        for r in ranks:
            with contextlib.suppress(Exception):
                await _within(clock, r.proc.wait(), 5.0)
            await _within(clock, asyncio.gather(*r.pumps, return_exceptions=True), 2.0)
            if r.frames is not None:
                r.frames.cancel()
            r.writer.close()
            close = getattr(r.proc, "close", None)
            if close is not None:
                close()

    async def restart(self) -> None:
        at = self.at
        at.restarting.clear()
        at.system("restarting the session: every rank is stopped and started again")
        await self.stop()
        at.launch.close()
        self.broken = None
        try:
            await self.start()
        except GPUlayerError as exc:
            self.broke(f"the restart failed: {exc.message}")
            await at.report_session("broken", self.broken)
            return
        await at.report_session("ready", None)


class _CellLines:
    """What ``pump_stream`` ships to: a rank's fd-level lines, tagged with the running cell."""

    def __init__(self, group: RankGroup, rank: int) -> None:
        self.group = group
        self.rank = rank
        self.redactor = group.at.redactor

    def add(self, stream: Stream, text: str, rank: int | None = None, *, ends: bool = True) -> None:
        self.group.at.shipper.add(stream, text, self.rank, self.group.cell, ends=ends)


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
