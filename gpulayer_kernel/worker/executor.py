"""Runs one job as a subprocess in its own process group; the same code for every transport.

Life of a job here: make its directory (a few folders, nothing copied) → get its bundle (cached
by digest, verified: a cell's text from memory; files, when the job needs them, copied from the
read-only unpacked cache) → build its environment (allow-list + declared + secrets) → start it in
a session of its own (warm: a Python job takes a process the worker's zygote forked ahead of
time, a command forks from the zygote) → stream stdout/stderr line by line to the control plane
→ on exit, timeout or cancel, stop the whole process group (SIGTERM, then SIGKILL after a grace
period) → upload ``$GPULAYER_OUTPUT`` files as artifacts → report the exit code, reason and JSON
result. Its directory is removed after the result is delivered, off the critical path. Every
wait with a deadline (the job's timeout, the kill grace) runs on the worker's
:class:`~gpulayer_kernel.clock.Clock`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from ..clock import SYSTEM_CLOCK, Clock
from ..contracts import Artifact, CommandWorkload, FinishReport, JobAssignment, PythonWorkload
from ..display import human_bytes
from ..errors import BundleError, GPUlayerError
from ..job import ARGS_ENV, CONTROL_ENV, JOB_ID_ENV, OUTPUT_ENV, RESULT_ENV
from ..redact import Redactor
from .bundlecache import BundleCache, Files, copy_tree
from .config import ExecutorConfig
from .control import ControlReader
from .env import base_env, job_env
from .exits import describe_exit, exit_status
from .jobtoken import scoped_env
from .launch import PEER_GRACE, Launch, device_env
from .logship import LogShipper, pump_stream
from .ports import PortReservations
from .processes import (
    Spawned,
    group_alive,
    killpg,
    main_exited,
    missing_program,
    reap_leftovers,
    spawn_cold,
    stop_now,
)
from .spares import ZygoteChild
from .transport import Transport
from .warm import WarmRunner
from .workspace import job_workspace
from .zygote_client import LaunchFailed

# Re-exported: ExecutorConfig lived here, and callers outside the worker still import it from here.
__all__ = ["ExecutorConfig", "JobExecutor", "reap_leftovers"]

log = logging.getLogger("gpulayer.worker")

MAX_RESULT_BYTES = 1 << 20
MAX_ARTIFACT_BYTES = 512 << 20
# A cell's text travels to its process in memory (one socket message) up to this size.
MAX_MEMORY_SOURCE = 64 << 10
PIPE_DRAIN = 5.0  # seconds the pumps get to ship what is left in the pipes after the job ends
GROUP_POLL = 0.02  # seconds between checks that a stopped job's process group is empty
STOP_WAIT = 2.0  # seconds the supervisor gets to kill a stopped job's processes and exit


class JobExecutor:
    """One attempt of one job on this worker."""

    def __init__(
        self,
        assignment: JobAssignment,
        transport: Transport,
        config: ExecutorConfig,
        *,
        ports: PortReservations,
        warm: WarmRunner | None = None,
        bundles: BundleCache | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """``ports``, ``warm`` and ``bundles`` are the worker's (its agent owns them); no
        ``warm``: cold only; no ``bundles``: a cache of this executor's own in the work root."""
        self.a = assignment
        self.job = assignment.job
        self.transport = transport
        self.config = config
        self.warm = warm
        self.bundles = bundles or BundleCache(
            config.work_root / "bundles", config.bundle_cache_bytes
        )
        # A cell's files, run from memory: the runner takes them instead of reading cwd.
        self._sources: dict[str, str] | None = None
        self._forced = False  # a stop had to SIGKILL the job
        self.clock = clock
        self.redactor = Redactor(assignment.secrets)
        queue = getattr(transport, "queue_logs", None) if _reports(transport) else None
        self.shipper = LogShipper(
            self._send_logs,
            self.redactor,
            clock=clock,
            queue=None if queue is None else lambda lines: queue(self.job.id, lines),
        )
        # torchrun around a gang (ADR 0007): its argv, rank tags, failure reason, reserved port.
        self.launch = Launch(assignment, transport, config, self.system, ports=ports, clock=clock)
        self.workspace = job_workspace(assignment, transport, config)  # ADR 0022: its folder
        self._started: asyncio.Task[None] | None = None  # the start's report, on its way
        self._cancel = asyncio.Event()
        self._cancel_reason = "cancelled"
        self.proc: Spawned | None = None  # the cold spawn's Process, or a ZygoteChild
        self.dir = config.work_root / "jobs" / f"{self.job.id}-{self.job.attempts}"
        if self.a.nnodes > 1:
            self.dir = self.dir.with_name(self.dir.name + f"-n{self.a.node.node_rank}")

    async def _send_logs(self, lines: list[Any]) -> None:
        await self.transport.append_logs(self.job.id, lines)

    def cancel(self, reason: str = "cancelled") -> None:
        self._cancel_reason = reason
        self._cancel.set()

    def system(self, text: str) -> None:
        self.shipper.add("system", text)

    async def run(self) -> FinishReport:
        try:
            report = await self._run()
        except BundleError as exc:
            self.system(f"error: {exc.message} (hint: {exc.hint})" if exc.hint else exc.message)
            report = FinishReport(state="failed", reason=f"{exc.code}: {exc.message}")
        except GPUlayerError as exc:
            self.system(f"error: {exc}")
            report = FinishReport(state="failed", reason=exc.message)
        except asyncio.CancelledError:
            await self._stop_group()
            raise
        except Exception as exc:
            log.exception("job %s crashed the executor", self.job.id)
            report = FinishReport(state="failed", reason=f"worker error: {exc!r}")
        finally:
            self.launch.close()  # the process is gone: release the rendezvous port
            await self.shipper.close()
        return self._redacted(report)

    def _redacted(self, report: FinishReport) -> FinishReport:
        """The report with secret values masked: the result (it may return ``os.environ[…]``)
        and the reason (it quotes a failing rank's last lines)."""
        if not self.a.secrets:
            return report
        redact = self.redactor
        return report.model_copy(
            update={
                "result": redact.redact_json(report.result),
                "reason": None if report.reason is None else redact.redact(report.reason),
            }
        )

    def cleanup(self) -> None:
        """Remove the job's directory (called after its result is delivered: off the hot path)."""
        if not self.config.keep_job_dirs:
            shutil.rmtree(self.dir, ignore_errors=True)

    async def _prepare(self) -> tuple[list[str], dict[str, str], Path]:
        spec = self.job.spec
        try:
            self.dir.mkdir(parents=True)
        except FileExistsError:  # left by a run before a restart of this worker
            shutil.rmtree(self.dir)
            self.dir.mkdir()
        out = self.dir / "output"
        out.mkdir()  # $GPULAYER_OUTPUT exists when the job starts, as jobs expect
        gl_env = {
            JOB_ID_ENV: self.job.id,
            "GPULAYER_JOB_NAME": spec.name,
            "GPULAYER_ATTEMPT": str(self.job.attempts),
            OUTPUT_ENV: str(out),
            RESULT_ENV: str(self.dir / "result.json"),
            CONTROL_ENV: str(self.dir / "control.fifo"),
        }
        workload = spec.workload
        cwd = self.dir
        if isinstance(workload, PythonWorkload):
            cwd = self.dir / "src"
            await self._place_bundle(workload.bundle, cwd, workload.entrypoint)
            args_file = self.dir / "args.json"
            args_file.write_text(json.dumps(workload.args))
            gl_env[ARGS_ENV] = str(args_file)
            argv = [self.config.python, "-m", "gpulayer_kernel.job.runner", workload.entrypoint]
        else:
            assert isinstance(workload, CommandWorkload)  # sessions run in SessionExecutor
            argv = list(workload.argv)
            if workload.bundle is not None:
                # `gpulayer run --files`: the command runs among its shipped files.
                cwd = self.dir / "src"
                await self._place_bundle(workload.bundle, cwd, None)
            elif spec.workdir:
                cwd = Path(spec.workdir)
                if not cwd.is_dir():
                    raise GPUlayerError(
                        f"workdir {spec.workdir} does not exist on worker "
                        f"{self.a.node.worker_name}",
                        hint="submit from a directory that exists on the worker, or bundle the "
                        "files with a Python workload",
                    )
        if self.workspace is not None:  # the notebook's folder: in place, or this worker's copy
            cwd = await self.workspace.prepare(cwd, gl_env, self.system)
        gl_env.update(device_env(self.a))
        # The control plane that placed it, as its owner (ADR 0022): one for every rank.
        gl_env.update(scoped_env(self.transport, self.a))
        env = job_env(
            base_env(extra_allowed=self.config.extra_env_allowed),
            spec.env,
            self.a.secrets,
            gl_env,
        )
        if isinstance(workload, PythonWorkload):
            # The runner must import this package even when the job's PATH python differs.
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH")) if p
            )
        argv = await self.launch.wrap(argv, env)
        return argv, env, cwd

    async def _place_bundle(self, digest: str, cwd: Path, entrypoint: str | None) -> None:
        """The job's files in ``cwd``: a cell alone in its bundle runs from memory (nothing
        written), anything else gets its own writable copy of the read-only unpacked bundle."""
        fetch = lambda: self.transport.fetch_blob(digest)  # noqa: E731
        files = await self.bundles.files(digest, fetch)
        cwd.mkdir()
        if files is not None and entrypoint is not None and self.a.nnodes == 1:
            sources = _memory_sources(files, entrypoint)
            if sources is not None and not self.job.spec.is_gang:
                self._sources = sources
                return
        cached = await self.bundles.acquire(digest, fetch)
        try:
            await asyncio.to_thread(copy_tree, cached, cwd)
        finally:
            # The job has its copy: the cache may evict the bundle from now on, even mid-job.
            self.bundles.release(digest)

    def _write_sources(self, cwd: Path) -> None:
        """The files a warm launch would have taken from memory, written for a cold start."""
        for name, text in (self._sources or {}).items():
            (cwd / name).write_text(text)
        self._sources = None

    async def _run(self) -> FinishReport:
        argv, env, cwd = await self._prepare()
        control = ControlReader(Path(env[CONTROL_ENV]), self._report_progress)
        try:
            if self._cancel.is_set():
                return FinishReport(state="cancelled", reason=self._cancel_reason)
            failed = await self._spawn(argv, env, cwd)
            if failed is not None:
                return failed
            assert self.proc is not None
            # Recorded so that a worker restarted after a hard crash can stop what this job left.
            (self.dir / "pgid").write_text(str(self.proc.pid))
            # Not awaited before the end: a short job's start travels with its end (the worker's
            # reporter merges them, in order); a refused start cancels the job meanwhile.
            self._started = asyncio.create_task(self._report_started())
            pumps = self._pump_output(self.proc)
            outcome, reason = await self._supervise(self.job.spec.timeout)
            # The main process is gone; stop anything it left behind in its group.
            await self._stop_group(grace=0.0 if outcome == "exited" else self.config.kill_grace)
            await self._drain(pumps)
        finally:
            control.close()
        report = await self._outcome(outcome, reason)
        return report if self.workspace is None else await self.workspace.finish(report)

    async def _spawn(self, argv: list[str], env: dict[str, str], cwd: Path) -> FinishReport | None:
        """Start the job's main process as ``self.proc``; the failed report when it cannot start."""
        missing = missing_program(argv[0], env.get("PATH", ""), cwd)
        if missing:
            return self._launch_failed(127, missing)
        spec = self.job.spec
        workload = spec.workload
        if self.warm is not None and self.config.warm_runner:
            # Warm path: fork the job's supervisor from this worker's zygote. A single-process
            # Python job runs in the fork itself, which has already paid the interpreter's
            # start-up and imports; anything else (commands, torchrun) is exec'd there. Same
            # pipes, session, env and exit status as the cold spawn; None (zygote unavailable,
            # or start-up variables a fork cannot honour) falls through to the next way.
            if isinstance(workload, PythonWorkload) and self.a.nnodes == 1 and not spec.is_gang:
                self.proc = await self.warm.spawn(
                    workload.entrypoint, cwd, env, sources=self._sources
                )
            if self.proc is None:
                self._write_sources(self.dir / "src")
                try:
                    self.proc = await self.warm.exec(argv, cwd, env)
                except LaunchFailed as exc:
                    return self._launch_failed(exc.code, exc.message)
        if self.proc is None:
            self._write_sources(self.dir / "src")
            try:
                self.proc = await spawn_cold(argv, cwd, env)
            except FileNotFoundError:
                return self._launch_failed(127, f"command not found: {argv[0]}")
            except PermissionError:
                return self._launch_failed(126, f"permission denied: {argv[0]}")
        return None

    def _pump_output(self, proc: Spawned) -> list[asyncio.Task[None]]:
        """Ship stdout and stderr line by line (tagged with ranks for a gang) until their EOF."""
        assert proc.stdout is not None and proc.stderr is not None
        split = self.launch.router
        return [
            asyncio.create_task(pump_stream(proc.stdout, "stdout", self.shipper, split("stdout"))),
            asyncio.create_task(pump_stream(proc.stderr, "stderr", self.shipper, split("stderr"))),
        ]

    async def _drain(self, pumps: list[asyncio.Task[None]]) -> None:
        """Ship what the pipes still hold, for a while: a grandchild may keep them open."""
        self.shipper.unblock()  # read it all now, however much still waits to be sent
        await _within(self.clock, asyncio.gather(*pumps, return_exceptions=True), PIPE_DRAIN)
        if isinstance(self.proc, ZygoteChild):
            self.proc.close()  # our own pipe transports (a cold spawn's Process closes its own)

    async def _outcome(self, outcome: str, reason: str) -> FinishReport:
        """The report of a job whose processes are gone: state, exit code, reason, result, files."""
        assert self.proc is not None
        code = self.proc.returncode
        exit_code = exit_status(code)
        if outcome in ("cancelled", "timeout"):
            if outcome == "timeout":
                self.system(reason)
            # One convention for a job the worker stopped, whatever its launcher made of the
            # signal (torchrun exits 1 after a SignalException): 128 + the signal that ended it.
            stopped_by = signal.SIGKILL if self._forced else signal.SIGTERM
            return FinishReport(
                state="cancelled" if outcome == "cancelled" else "failed",
                exit_code=128 + stopped_by,
                reason=reason,
                artifacts=await self._artifacts(),
            )
        artifacts = await self._artifacts()
        if code != 0:
            why = self.launch.failure_reason(code) or describe_exit(code)
            note = self.launch.launcher_note()
            if note:
                self.system(note)
            if self.launch.peer_failure():
                # Our rank only lost a peer on another node: let that node's report (the root
                # cause) reach the control plane first; its cancel of this node ends the wait.
                await _within(self.clock, self._cancel.wait(), PEER_GRACE)
            return FinishReport(
                state="failed", exit_code=exit_code, reason=why, artifacts=artifacts
            )
        result, problem = self._result()
        if problem:
            self.system(problem)
            return FinishReport(state="failed", exit_code=0, reason=problem, artifacts=artifacts)
        return FinishReport(state="succeeded", exit_code=0, result=result, artifacts=artifacts)

    async def _report_progress(self, fields: dict[str, Any]) -> None:
        await self.transport.report_progress(self.job.id, self.redactor.redact_json(fields))

    async def _report_started(self) -> None:
        # Runs beside the process's own start-up rather than before it.
        try:
            await self.transport.report_started(self.job.id)
        except GPUlayerError as exc:
            # Cancelled or reassigned between placement and start: stop at once.
            self.cancel(exc.message)

    def _launch_failed(self, code: int, reason: str) -> FinishReport:
        self.system(reason)
        return FinishReport(state="failed", exit_code=code, reason=reason)

    async def _supervise(self, timeout: float | None) -> tuple[str, str]:
        """Wait for the main process to exit, a cancel, or the job's timeout: whichever is first."""
        assert self.proc is not None
        exited = asyncio.create_task(main_exited(self.proc))
        cancelled = asyncio.create_task(self._cancel.wait())
        first: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def settle(_task: object) -> None:
            if not first.done():
                first.set_result(None)

        for task in (exited, cancelled):
            task.add_done_callback(settle)
        try:
            await self.clock.wait_for(first, timeout)
            has_exited, was_cancelled = exited.done(), cancelled.done()
        finally:
            cancelled.cancel()
            exited.cancel()
            first.cancel()
        if has_exited:
            return "exited", ""
        if was_cancelled:
            await self._stop_group()
            return "cancelled", self._cancel_reason
        assert timeout is not None
        await self._stop_group()
        return "timeout", f"timed out after {timeout:g}s (the job's timeout); killed"

    async def _stop_group(self, grace: float | None = None) -> None:
        """SIGTERM the job's process group, then SIGKILL what is left after the grace period."""
        if self.proc is None:
            return
        grace = self.config.kill_grace if grace is None else grace
        pgid = self.proc.pid
        if grace > 0 and group_alive(pgid):
            killpg(pgid, signal.SIGTERM)
            deadline = self.clock.monotonic() + grace
            await _within(self.clock, self.proc.wait(), grace)
            # Children of the main process may outlive it; give them the rest of the grace. No
            # event says a process group is empty (they are not our children): poll, briefly.
            while group_alive(pgid) and self.clock.monotonic() < deadline:
                await asyncio.sleep(GROUP_POLL)
        if self.proc.returncode is None:
            self._forced = True  # the grace ran out: what is left is killed
            # Everything the job started dies, even what left the group (killed by the zygote,
            # or by the cold path's supervisor).
            stop_now(self.proc)
            await _within(self.clock, self.proc.wait(), STOP_WAIT)
        killpg(pgid, signal.SIGKILL)  # what is left of the group, if the supervisor was stuck
        with contextlib.suppress(ProcessLookupError):
            await self.proc.wait()

    def _result(self) -> tuple[Any, str | None]:
        path = self.dir / "result.json"
        if not path.exists():
            return None, None
        if path.stat().st_size > MAX_RESULT_BYTES:
            return None, (
                f"the job's result is {human_bytes(path.stat().st_size)} of JSON, over the "
                f"{human_bytes(MAX_RESULT_BYTES)} limit; write large outputs to $GPULAYER_OUTPUT "
                "instead"
            )
        try:
            return json.loads(path.read_text()), None
        except ValueError as exc:
            return None, f"the job's result is not valid JSON: {exc}"

    async def _artifacts(self) -> list[Artifact]:
        out = self.dir / "output"
        found: list[Artifact] = []
        if not out.is_dir():
            return found
        for path in sorted(p for p in out.rglob("*") if p.is_file() and not p.is_symlink()):
            size = path.stat().st_size
            # A gang's ranks each write under rank<R>/ (ADR 0007); others keep their paths.
            name, rank = self.launch.artifact_name(path.relative_to(out).as_posix())
            if size > MAX_ARTIFACT_BYTES:
                self.system(f"artifact {name} skipped: {human_bytes(size)} is over the limit")
                continue
            data = await asyncio.to_thread(path.read_bytes)
            digest = await self.transport.put_blob(data)
            found.append(Artifact(digest=digest, size=size, name=name, rank=rank))
        return found


def _reports(transport: Transport) -> bool:
    """Whether the transport sends through the worker's reporter (the agent's attempts do)."""
    return getattr(transport, "reporter", None) is not None


def _memory_sources(files: Files, entrypoint: str) -> dict[str, str] | None:
    """A cell whose bundle holds nothing but its own file: its text, to run from memory."""
    name = entrypoint.removeprefix("cell:")
    if name == entrypoint or set(files) != {name} or len(files[name]) > MAX_MEMORY_SOURCE:
        return None
    try:
        return {name: files[name].decode()}
    except UnicodeDecodeError:
        return None


async def _within(clock: Clock, aw: Awaitable[object], timeout: float | None) -> bool:
    """Await ``aw`` for at most ``timeout`` seconds of ``clock``; stop it when time runs out."""
    task = asyncio.ensure_future(aw)
    try:
        return await clock.wait_for(task, timeout)
    finally:
        task.cancel()
