"""Runs one job as a subprocess in its own process group; the same code for every transport.

Life of a job here: make its directory → fetch and unpack its bundle (cached by digest, verified)
→ build its environment (allow-list + declared + secrets) → spawn it with ``start_new_session`` →
stream stdout/stderr line by line to the control plane → on exit, timeout or cancel, stop the whole
process group (SIGTERM, then SIGKILL after a grace period) → upload ``$GPULAYER_OUTPUT`` files as
artifacts → report the exit code, reason and JSON result.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import bundles
from ..contracts import Artifact, FinishReport, JobAssignment, PythonWorkload
from ..errors import GPUlayerError
from ..job import ARGS_ENV, CONTROL_ENV, JOB_ID_ENV, OUTPUT_ENV, RESULT_ENV
from ..redact import Redactor
from . import launch, zygote
from .env import base_env, job_env
from .logship import LogShipper, pump_stream
from .transport import Transport

log = logging.getLogger("gpulayer.worker")

MAX_RESULT_BYTES = 1 << 20
MAX_ARTIFACT_BYTES = 512 << 20
_SETPRIV = shutil.which("setpriv")


@dataclass
class ExecutorConfig:
    work_root: Path
    kill_grace: float = 5.0
    extra_env_allowed: tuple[str, ...] = ()
    keep_job_dirs: bool = False
    python: str = sys.executable
    advertise_addr: str = "127.0.0.1"
    rendezvous_timeout: float = 120.0
    bundle_cache: dict[str, bytes] = field(default_factory=dict)
    # Fork single-process Python jobs from a warm interpreter (worker/zygote.py): saves the job's
    # interpreter start-up and imports. GPULAYER_WARM_RUNNER=0 turns it off.
    warm_runner: bool = field(
        default_factory=lambda: os.environ.get("GPULAYER_WARM_RUNNER", "1") != "0"
    )


class JobExecutor:
    """One attempt of one job on this worker."""

    def __init__(self, assignment: JobAssignment, transport: Transport, config: ExecutorConfig):
        self.a = assignment
        self.job = assignment.job
        self.transport = transport
        self.config = config
        self.redactor = Redactor(assignment.secrets)
        self.shipper = LogShipper(self._send_logs, self.redactor)
        # torchrun around a gang (ADR 0007): its argv, rank tags, failure reason, reserved port.
        self.launch = launch.Launch(assignment, transport, config, self.system)
        self._cancel = asyncio.Event()
        self._cancel_reason = "cancelled"
        self.proc: zygote.Spawned | None = None  # the cold spawn's Process, or a ZygoteChild
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
        except GPUlayerError as exc:
            self.system(f"error: {exc}")
            report = FinishReport(state="failed", reason=exc.message)
        except asyncio.CancelledError:
            await self._stop_group()
            raise
        except Exception as exc:  # noqa: BLE001 - a worker bug must fail the job, not hang it
            log.exception("job %s crashed the executor", self.job.id)
            report = FinishReport(state="failed", reason=f"worker error: {exc!r}")
        finally:
            self.launch.close()  # the process is gone: release the rendezvous port
            await self.shipper.close()
        return report

    def cleanup(self) -> None:
        """Remove the job's directory (called after its result is delivered: off the hot path)."""
        if not self.config.keep_job_dirs:
            shutil.rmtree(self.dir, ignore_errors=True)

    async def _prepare(self) -> tuple[list[str], dict[str, str], Path]:
        spec = self.job.spec
        if self.dir.exists():
            shutil.rmtree(self.dir)
        out = self.dir / "output"
        out.mkdir(parents=True)
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
            src = self.dir / "src"
            data = await self._bundle(workload.bundle)
            await asyncio.to_thread(bundles.unpack, data, workload.bundle, src)
            args_file = self.dir / "args.json"
            args_file.write_text(json.dumps(workload.args))
            gl_env[ARGS_ENV] = str(args_file)
            argv = [self.config.python, "-m", "gpulayer_kernel.runner", workload.entrypoint]
            cwd = src
        else:
            argv = list(workload.argv)
            if spec.workdir:
                cwd = Path(spec.workdir)
                if not cwd.is_dir():
                    raise GPUlayerError(
                        f"workdir {spec.workdir} does not exist on worker "
                        f"{self.a.node.worker_name}",
                        hint="submit from a directory that exists on the worker, or bundle the "
                        "files with a Python workload",
                    )
        gl_env.update(launch.device_env(self.a))
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

    async def _bundle(self, digest: str) -> bytes:
        cache = self.config.bundle_cache
        if digest not in cache:
            data = await self.transport.fetch_blob(digest)
            bundles.verify(data, digest)
            cache[digest] = data
        return cache[digest]

    async def _run(self) -> FinishReport:
        spec = self.job.spec
        argv, env, cwd = await self._prepare()
        fifo = Path(env[CONTROL_ENV])
        os.mkfifo(fifo, 0o600)
        control = _ControlReader(fifo, self)
        if self._cancel.is_set():
            return FinishReport(state="cancelled", reason=self._cancel_reason)
        missing = _missing_program(argv[0], env.get("PATH", ""), cwd)
        if missing:
            control.close()
            return self._launch_failed(127, missing)
        workload = spec.workload
        if (
            self.config.warm_runner
            and isinstance(workload, PythonWorkload)
            and self.a.nnodes == 1
            and not spec.is_gang  # gangs run under torchrun: always the cold spawn
        ):
            # Warm path: fork the job from this worker's zygote, which has already paid the
            # interpreter's start-up and imports. Same pipes, session, env and exit status as
            # below; None (zygote unavailable) falls through to the cold spawn.
            self.proc = await zygote.spawn(self.config, workload.entrypoint, cwd, env)
        # setpriv: if this worker dies hard, the kernel kills the job's main process too.
        prefix = [_SETPRIV, "--pdeathsig", "SIGKILL", "--"] if _SETPRIV else []
        try:
            if self.proc is None:
                self.proc = await asyncio.create_subprocess_exec(
                    *prefix,
                    *argv,
                    cwd=cwd,
                    env=env,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    start_new_session=True,
                )
        except FileNotFoundError:
            control.close()
            return self._launch_failed(127, f"command not found: {argv[0]}")
        except PermissionError:
            control.close()
            return self._launch_failed(126, f"permission denied: {argv[0]}")
        # Recorded so that a worker restarted after a hard crash can stop what this job left.
        (self.dir / "pgid").write_text(str(self.proc.pid))
        started = asyncio.create_task(self._report_started())
        assert self.proc.stdout is not None and self.proc.stderr is not None
        pumps = [
            asyncio.create_task(
                pump_stream(
                    self.proc.stdout, "stdout", self.shipper, self.launch.splitter("stdout")
                )
            ),
            asyncio.create_task(
                pump_stream(
                    self.proc.stderr, "stderr", self.shipper, self.launch.splitter("stderr")
                )
            ),
        ]
        outcome, reason = await self._supervise(spec.timeout)
        await started
        # The main process is gone; stop anything it left behind in its group.
        await self._stop_group(grace=0.0 if outcome == "exited" else self.config.kill_grace)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.gather(*pumps, return_exceptions=True), 5.0)
        for t in pumps:
            t.cancel()
        if isinstance(self.proc, zygote.ZygoteChild):
            self.proc.close()  # our own pipe transports (a cold spawn's Process closes its own)
        control.close()
        code = self.proc.returncode
        exit_code = _exit_code(code)
        if outcome == "cancelled":
            return FinishReport(
                state="cancelled",
                exit_code=exit_code,
                reason=reason,
                artifacts=await self._artifacts(),
            )
        if outcome == "timeout":
            self.system(reason)
            return FinishReport(
                state="failed",
                exit_code=exit_code,
                reason=reason,
                artifacts=await self._artifacts(),
            )
        artifacts = await self._artifacts()
        if code != 0:
            why = self.launch.failure_reason(code) or _describe_exit(code)
            if self.launch.peer_failure():
                # Our rank only lost a peer on another node: let that node's report (the root
                # cause) reach the control plane first; its cancel of this node ends the wait.
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._cancel.wait(), launch.PEER_GRACE)
            return FinishReport(
                state="failed", exit_code=exit_code, reason=why, artifacts=artifacts
            )
        result, problem = self._result()
        if problem:
            self.system(problem)
            return FinishReport(state="failed", exit_code=0, reason=problem, artifacts=artifacts)
        return FinishReport(state="succeeded", exit_code=0, result=result, artifacts=artifacts)

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
        assert self.proc is not None
        exited = asyncio.create_task(_main_exited(self.proc))
        cancelled = asyncio.create_task(self._cancel.wait())
        try:
            done, _ = await asyncio.wait(
                {exited, cancelled}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            cancelled.cancel()
            exited.cancel()
        if exited in done:
            return "exited", ""
        if cancelled in done:
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
        if grace > 0 and _group_alive(pgid):
            _killpg(pgid, signal.SIGTERM)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + grace
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.proc.wait(), grace)
            # Children of the main process may outlive it; give them the rest of the grace.
            while _group_alive(pgid) and loop.time() < deadline:
                await asyncio.sleep(0.02)
        _killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            await self.proc.wait()

    def _result(self) -> tuple[Any, str | None]:
        path = self.dir / "result.json"
        if not path.exists():
            return None, None
        if path.stat().st_size > MAX_RESULT_BYTES:
            return None, (
                f"the job's result is {path.stat().st_size} bytes of JSON, over the "
                f"{MAX_RESULT_BYTES}-byte limit; write large outputs to $GPULAYER_OUTPUT instead"
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
                self.system(f"artifact {name} skipped: {size} bytes is over the limit")
                continue
            data = await asyncio.to_thread(path.read_bytes)
            digest = await self.transport.put_blob(data)
            found.append(Artifact(digest=digest, size=size, name=name, rank=rank))
        return found


class _ControlReader:
    """Reads progress messages from the job's FIFO without blocking the loop or polling."""

    def __init__(self, path: Path, executor: JobExecutor) -> None:
        self.executor = executor
        self._buf = b""
        # Open the read end first (non-blocking), then our own write end so the reader never sees
        # EOF when the job closes its end: EOF on a FIFO would make the fd readable forever.
        self.rfd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self.wfd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.rfd, self._readable)
        self._tasks: set[asyncio.Task[None]] = set()

    def _readable(self) -> None:
        try:
            chunk = os.read(self.rfd, 65536)
        except BlockingIOError:
            return
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        for raw in lines:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            if isinstance(msg, dict) and msg.get("kind") == "progress":
                fields = msg.get("fields")
                if isinstance(fields, dict):
                    t = asyncio.create_task(self._progress(fields))
                    self._tasks.add(t)
                    t.add_done_callback(self._tasks.discard)

    async def _progress(self, fields: dict[str, Any]) -> None:
        try:
            await self.executor.transport.report_progress(self.executor.job.id, fields)
        except Exception as exc:  # noqa: BLE001 - progress is best effort
            log.debug("progress report failed: %s", exc)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._readable()  # drain what the job wrote last
        self._loop.remove_reader(self.rfd)
        for fd in (self.rfd, self.wfd):
            with contextlib.suppress(OSError):
                os.close(fd)


def _missing_program(program: str, path: str, cwd: Path) -> str | None:
    """Why ``program`` cannot be started, or None (checked before spawning: clear reasons)."""
    if "/" in program:
        full = Path(program) if Path(program).is_absolute() else cwd / program
        if not full.exists():
            return f"command not found: {program} (no such file)"
        if not os.access(full, os.X_OK):
            return f"permission denied: {program} is not executable"
        return None
    if shutil.which(program, path=path) is None:
        return f"command not found: {program} (not on the job's PATH)"
    return None


def reap_leftovers(work_root: Path) -> list[int]:
    """Stop processes of jobs whose worker died hard, and remove their directories.

    Called when a worker starts, before it runs anything: every job directory still present
    belongs to a previous incarnation. Only processes in the recorded process group whose
    environment names that job are killed, so a recycled pid is never hit.
    """
    killed: list[int] = []
    jobs_dir = work_root / "jobs"
    if not jobs_dir.is_dir():
        return killed
    for job_dir in jobs_dir.iterdir():
        job_id = job_dir.name.split("-")[0]
        with contextlib.suppress(OSError, ValueError):
            pgid = int((job_dir / "pgid").read_text())
            marker = f"{JOB_ID_ENV}={job_id}".encode()
            for proc_dir in Path("/proc").iterdir():
                if not proc_dir.name.isdigit():
                    continue
                with contextlib.suppress(OSError, ValueError, IndexError):
                    stat = (proc_dir / "stat").read_text()
                    if int(stat.rsplit(")", 1)[1].split()[2]) != pgid:
                        continue
                    if marker not in (proc_dir / "environ").read_bytes().split(b"\0"):
                        continue
                    os.kill(int(proc_dir.name), signal.SIGKILL)
                    killed.append(int(proc_dir.name))
        shutil.rmtree(job_dir, ignore_errors=True)
    return killed


async def _main_exited(proc: zygote.Spawned) -> None:
    """Wait for the job's main process to exit, even while its children hold the pipes open.

    On Python 3.11 ``Process.wait()`` also waits for stdout/stderr to close, which a leftover
    grandchild can delay forever; a pidfd becomes readable the moment the main process exits.
    A zygote child's ``wait()`` ends with the zygote's exit message, which carries the status
    (a pidfd would fire before it arrives), and never waits for pipes.
    """
    if isinstance(proc, zygote.ZygoteChild):
        await proc.wait()
        return
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        await proc.wait()
        return
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not fut.done():
            fut.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await fut
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _exit_code(code: int | None) -> int | None:
    if code is None:
        return None
    return 128 - code if code < 0 else code


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "the process did not report an exit status"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}"
    return f"exited with code {code}"
