"""The soak: steady submits and 100 polling workers while ``gpulayer serve`` is killed, restarted.

    .venv/bin/python benchmarks/soak.py [--seconds 60] [--rate 50] [--workers 100] [--kills 10]
                                        [--grace 60] [--retries 0] [--real-workers 0] [--quick]
                                        [--mix] [--chatty-lines 100000] [--seed N]

``gpulayer serve`` runs as a subprocess on 127.0.0.1 with its own temporary home. ``--workers``
fake workers in this process speak the worker protocol over HTTP (``HttpTransport``, as in
``bench_http.py``): each "executor" reports started and finished at once, and every assignment it
runs is written down (job id, attempt, worker, when). ``--real-workers`` adds ``gpulayer worker``
processes whose job (``sh -c 'echo $GPULAYER_JOB_ID $GPULAYER_ATTEMPT >> runs.log'``) writes the
same record. A submitter sends ``--rate`` submits/s for ``--seconds`` (open loop: one every 1/rate
s, each in its own task), and the server is SIGKILLed and restarted ``--kills`` times at even
intervals (``ServeProcess.restart(kill=True)``: same port, same home). Workers and the submitter
ride through each restart: a connection error is retried after a short backoff; a worker whose
session the server no longer knows joins again (``HttpTransport.register`` tries its session
token, then the join token with its old id). Then every job is given ``--grace`` seconds to end.

Each submit carries an idempotency key (ADR 0003) that it keeps across its retries, so a submit
whose answer a kill swallowed is answered, when sent again, with the job it made. The kills come
at random moments (``--seed``; one in each even slice of the window, so they spread). ``--mix``
adds, on the real workers, chatty jobs (``--chatty-lines``), ``/jobs/run``, batch submits and
session cells, some killed mid-output (``soak_mix.py``).

Printed: submitted, acknowledged, succeeded, and the defects:
  * lost: acknowledged but missing from the server, or ended ``lost`` (a mix job: not succeeded);
  * stuck: not in a final state after the grace period (any soak job, acknowledged or not);
  * double: an attempt of a job run more than once (a legitimate retry is a new attempt, so it
    is not counted; a redelivered assignment of an attempt that already ran is);
  * wrong: a result or cell value that belongs to another request;
  * extra: a second job (or cell) made for one request;
and p50/p99 submit latency of acknowledged submits (from the first try, so including the wait
through a restart; the answered request alone is printed beside it). Each defect is listed with
its job's state, attempts, worker and times relative to the restarts. The last line is
``lost+stuck+double+wrong+extra = N``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import math
import os
import random
import secrets
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from _machine import describe  # benchmarks/_machine.py (scripts run from benchmarks/)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from soak_mix import POOL, Mix, Verdicts, drive, judge  # noqa: E402

from gpulayer_kernel.client.clients import AsyncClient  # noqa: E402
from gpulayer_kernel.contracts import (  # noqa: E402
    CommandWorkload,
    FinishReport,
    Job,
    JobAssignment,
    JobSpec,
    JobState,
    Resources,
    WorkerRegistration,
)
from gpulayer_kernel.errors import (  # noqa: E402
    Conflict,
    GPUlayerError,
    NotFound,
    Unauthorized,
    Unavailable,
)
from gpulayer_kernel.testing import ServeProcess, WorkerProcess  # noqa: E402
from gpulayer_kernel.worker.http import HttpTransport  # noqa: E402

ACTIVE = (JobState.QUEUED, JobState.PLACED, JobState.RUNNING)
T = TypeVar("T")
SHOW = 10  # defects listed in full per kind; the rest are counted


def short_backoff(attempt: int) -> float:
    """Retry soon: a restart takes a second or two, and the soak measures how long it hurts."""
    return min(0.5, 0.02 * 2.0 ** min(attempt, 5))


def pct(values: list[float], q: float) -> float:
    """The q-th quantile (nearest rank) of ``values``; nan when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass
class Run:
    """One execution of one attempt of a job by one worker's executor."""

    worker: str
    attempt: int
    at: float | None  # seconds since the soak began (None: a real worker's, time unknown)
    finish: str = "pending"  # "accepted", "refused: …", "pending" (never answered)
    finished_at: float | None = None


@dataclass
class Ledger:
    """What the workers were handed and ran, and how the protocol treated them."""

    t0: float
    runs: dict[str, list[Run]] = field(default_factory=lambda: defaultdict(list))
    duplicates_ignored: int = 0  # an assignment of a job this worker is running right now
    cancels: int = 0
    rejoins: int = 0
    poll_errors: int = 0

    def now(self) -> float:
        return time.monotonic() - self.t0


def attempt_of(a: JobAssignment) -> int:
    """The attempt an assignment is for: its own field if the protocol has one, else the job's."""
    attempt = getattr(a, "attempt", None)
    return int(attempt) if attempt is not None else a.job.attempts


class FakeWorker:
    """A polling worker over HTTP whose executor runs nothing: started, finished (at once)."""

    def __init__(
        self, url: str, join: str, name: str, ledger: Ledger, stop: asyncio.Event, work: float
    ) -> None:
        self.t = HttpTransport(url, join, retry_for=30.0)
        self.name = name
        self.work = work  # seconds each job "runs" between started and finished
        self.ledger = ledger
        self.stop = stop
        self.running: set[str] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.joined = asyncio.Event()

    async def join(self) -> None:
        attempt = 0
        while True:
            try:
                await self.t.register(WorkerRegistration(name=self.name))
                self.joined.set()
                return
            except GPUlayerError:  # unreachable, restarting, or our session is from before
                await asyncio.sleep(short_backoff(attempt))
                attempt += 1

    async def main(self) -> None:
        await self.join()
        beat = asyncio.create_task(self.heartbeats())
        failures = 0
        try:
            while not self.stop.is_set():
                try:
                    work = await self.t.next_work(20.0)
                    failures = 0
                except (NotFound, Unauthorized):
                    self.ledger.rejoins += 1
                    await self.join()
                    continue
                except GPUlayerError:  # the server is restarting (or refused): try again soon
                    self.ledger.poll_errors += 1
                    await asyncio.sleep(short_backoff(failures))
                    failures += 1
                    continue
                for a in work.assignments:
                    if a.job.id in self.running:  # like the agent: a duplicate is ignored
                        self.ledger.duplicates_ignored += 1
                        continue
                    self.running.add(a.job.id)
                    task = asyncio.create_task(self.execute(a))
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
                self.ledger.cancels += len(work.cancel)
        finally:
            beat.cancel()
            for task in [beat, *self.tasks]:
                task.cancel()
            await asyncio.gather(beat, *self.tasks, return_exceptions=True)
            await self.t.close()

    async def heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.t.heartbeat_interval or 5.0)
            with contextlib.suppress(GPUlayerError):
                await self.t.heartbeat()

    async def execute(self, a: JobAssignment) -> None:
        """What the agent and executor do around a job whose process exits at once."""
        job_id = a.job.id
        run = Run(self.name, attempt_of(a), self.ledger.now())
        self.ledger.runs[job_id].append(run)
        report = FinishReport(state="succeeded", exit_code=0)
        try:
            try:
                await self.t.report_started(job_id)  # retried by the transport through restarts
            except GPUlayerError as exc:  # the executor stops the process it already started
                report = FinishReport(state="cancelled", reason=exc.message)
            if self.work:
                await asyncio.sleep(self.work)
            attempt = 0
            while True:  # like the agent: deliver until the control plane has the result
                try:
                    await self.t.report_finished(job_id, report)
                    run.finish = "accepted"
                    break
                except (Conflict, NotFound) as exc:
                    run.finish = f"refused: {exc.message}"
                    break
                except Unauthorized:
                    pass  # the poll loop joins again; then this goes through
                except GPUlayerError as exc:
                    if exc.status < 500:
                        run.finish = f"refused: {exc.message}"
                        break
                await asyncio.sleep(short_backoff(attempt))
                attempt += 1
            run.finished_at = self.ledger.now()
        finally:
            self.running.discard(job_id)


@dataclass
class Submitted:
    """The fate of one submit (one name; a retried submit keeps its name)."""

    name: str
    job_id: str | None = None
    latency: float = math.nan  # first try to the answer
    last_try: float = math.nan  # the answered request alone
    tries: int = 0
    refused: str | None = None
    key: str = field(default_factory=lambda: uuid.uuid4().hex)  # kept across its retries


async def submit_one(client: AsyncClient, spec: JobSpec, s: Submitted, give_up: float) -> None:
    t_first = time.monotonic()
    attempt = 0
    while True:
        t_try = time.monotonic()
        s.tries += 1
        try:
            job = await client.submit(spec, idempotency_key=s.key)
        except Unavailable:  # connection refused or reset: the server is restarting
            if time.monotonic() >= give_up:
                return
            await asyncio.sleep(short_backoff(attempt))
            attempt += 1
            continue
        except GPUlayerError as exc:
            s.refused = f"{type(exc).__name__}: {exc.message}"
            return
        now = time.monotonic()
        s.job_id, s.latency, s.last_try = job.id, now - t_first, now - t_try
        return


async def submitter(
    client: AsyncClient, run_id: str, argv: list[str], args: argparse.Namespace, t0: float
) -> list[Submitted]:
    """Open loop: submit i starts at t0 + i/rate whatever the earlier ones are doing."""
    out: list[Submitted] = []
    tasks: list[asyncio.Task[None]] = []
    give_up = t0 + args.seconds + 30.0
    for i in range(int(args.seconds * args.rate)):
        await asyncio.sleep(max(0.0, t0 + i / args.rate - time.monotonic()))
        s = Submitted(f"soak-{i:06d}")
        spec = JobSpec(
            name=s.name,
            workload=CommandWorkload(argv=argv),
            # One CPU each, on one-CPU workers: a job without a CPU ask fits any worker, so every
            # job would go to the same one (the lowest id) and the other workers would only poll.
            resources=Resources(cpus=1),
            labels={"soak": run_id},
            retries=args.retries,
        )
        out.append(s)
        tasks.append(asyncio.create_task(submit_one(client, spec, s, give_up)))
    await asyncio.gather(*tasks)
    return out


async def killer(
    server: ServeProcess, kills: int, seconds: float, t0: float, rng: random.Random
) -> list[tuple[float, float]]:
    """SIGKILL and restart the server ``kills`` times at random moments (one in each of
    ``kills`` even slices of the window, so they spread); (killed at, down for)."""
    done: list[tuple[float, float]] = []
    slice_ = seconds / (kills + 1)
    for k in range(kills):
        at_ = t0 + slice_ * (k + 0.5 + rng.random())
        await asyncio.sleep(max(0.0, at_ - time.monotonic()))
        at = time.monotonic()
        await asyncio.to_thread(server.restart, kill=True)
        done.append((at - t0, time.monotonic() - at))
    return done


async def retrying(fn: Callable[[], Awaitable[T]]) -> T:
    """A read that must get through: the server may be coming back from the last restart."""
    attempt = 0
    while True:
        try:
            return await fn()
        except Unavailable:
            if attempt > 60:
                raise
            await asyncio.sleep(short_backoff(attempt))
            attempt += 1


async def settle(client: AsyncClient, run_id: str, grace: float) -> float:
    """Wait (at most ``grace`` s) until no soak job is queued, placed or running; seconds taken."""
    t = time.monotonic()
    while time.monotonic() - t < grace:
        active = await retrying(lambda: client.list(ACTIVE, label=("soak", run_id), limit=10_000))
        if not active:
            break
        await asyncio.sleep(0.25)
    return time.monotonic() - t


def real_runs(path: Path, tmp: Path, ledger: Ledger) -> int:
    """Add what the real workers' jobs wrote (``JOB_ID ATTEMPT OUTPUT_DIR``) to the ledger."""
    if not path.exists():
        return 0
    n = 0
    for line in path.read_text().splitlines():
        job_id, attempt, output = [*line.split(" ", 2), "", ""][:3]
        if job_id:
            parts = Path(output).relative_to(tmp).parts if output.startswith(str(tmp)) else ()
            worker = parts[0] if parts else "real"  # the worker's home: tmp/real-N/…
            ledger.runs[job_id].append(Run(worker, int(attempt or 0), None, "n/a"))
            n += 1
    return n


def when(t: float | None, restarts: list[tuple[float, float]]) -> str:
    """``+12.30s (0.41s after kill #3)``: a time beside the last restart before it."""
    if t is None:
        return "?"
    before = [(k, at) for k, (at, _) in enumerate(restarts, 1) if at <= t]
    if not before:
        return f"+{t:.2f}s"
    k, at = before[-1]
    return f"+{t:.2f}s ({t - at:.2f}s after kill #{k})"


def describe_job(
    job: Job, runs: list[Run], wall0: float, restarts: list[tuple[float, float]]
) -> str:
    def rel(ts: float | None) -> str:
        return when(None if ts is None else ts - wall0, restarts)

    worker = ",".join(n.worker_name for n in job.placement.nodes) if job.placement else "-"
    ran = "; ".join(
        f"{r.worker} attempt {r.attempt} at {when(r.at, restarts)}, finish {r.finish}"
        + (f" at {when(r.finished_at, restarts)}" if r.finished_at is not None else "")
        for r in runs
    )
    return (
        f"    {job.id} {job.spec.name}: {job.state.value}, attempts {job.attempts}, on {worker}, "
        f"submitted {rel(job.submitted_at)}, placed {rel(job.placed_at)}, "
        f"started {rel(job.started_at)}, finished {rel(job.finished_at)}"
        + (f", reason {job.reason!r}" if job.reason else "")
        + f"\n      runs: {ran or 'none'}"
    )


def show(title: str, items: list[str]) -> None:
    print(f"{title}: {len(items)}")
    for line in items[:SHOW]:
        print(line)
    if len(items) > SHOW:
        print(f"    … and {len(items) - SHOW} more")


async def soak(args: argparse.Namespace, tmp: Path) -> int:
    run_id = secrets.token_hex(4)
    runs_log = tmp / "runs.log"
    # What a real worker's job writes: its id, attempt and output dir (under the worker's home).
    line = '"$GPULAYER_JOB_ID $GPULAYER_ATTEMPT $GPULAYER_OUTPUT"'
    argv = ["sh", "-c", f"echo {line} >> {runs_log}"]
    stop = asyncio.Event()
    rng = random.Random(args.seed)
    mix = Mix(run_id, runs_log, args.chatty_lines, args.mix_every) if args.mix else None
    verdicts = Verdicts()
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(ServeProcess(tmp / "serve-home"))
        join = server.create_token("join")
        for i in range(args.real_workers):
            wp = WorkerProcess(
                server.url, join, name=f"real-{i}", home=tmp / f"real-{i}", labels=POOL
            )
            stack.enter_context(wp)
        ledger = Ledger(time.monotonic())
        fakes = [
            FakeWorker(server.url, join, f"w{i:03d}", ledger, stop, args.job_seconds)
            for i in range(args.workers)
        ]
        worker_tasks = [asyncio.create_task(f.main()) for f in fakes]
        try:
            async with AsyncClient(server.url, server.admin_token) as client:
                await asyncio.wait_for(asyncio.gather(*(f.joined.wait() for f in fakes)), 60)
                t0 = ledger.t0 = time.monotonic()
                cpu0 = time.process_time()
                wall0 = time.time()
                kills = asyncio.create_task(killer(server, args.kills, args.seconds, t0, rng))
                mixed = asyncio.create_task(
                    drive(client, mix, args.seconds, args.grace) if mix else asyncio.sleep(0)
                )
                subs = await submitter(client, run_id, argv, args, t0)
                restarts = await kills
                await mixed
                window = time.monotonic() - t0
                cpu = time.process_time() - cpu0
                if mix is not None:
                    verdicts = await judge(client, mix, args.grace)
                    if mix.session:  # its job would otherwise hold the settle below
                        with contextlib.suppress(GPUlayerError):
                            await client.stop_session(mix.session, "the soak is over")
                waited = await settle(client, run_id, args.grace)
                jobs = {
                    j.id: j
                    for j in await retrying(
                        lambda: client.list(label=("soak", run_id), limit=10_000)
                    )
                }
                for job_id in {s.job_id for s in subs if s.job_id} - jobs.keys():
                    with contextlib.suppress(NotFound):  # past the list's limit, or missing
                        jobs[job_id] = await retrying(functools.partial(client.get, job_id))
        finally:
            stop.set()
            for task in worker_tasks:
                task.cancel()
            ended = await asyncio.gather(*worker_tasks, return_exceptions=True)
            for e in ended:  # a fake worker that died early would leave its jobs stuck
                if isinstance(e, Exception):
                    print(f"a fake worker failed: {e!r}")
        serve_log = server.output()
    n_real = real_runs(runs_log, tmp, ledger)
    return report(
        args,
        subs,
        jobs,
        ledger,
        restarts,
        wall0,
        (window, cpu, waited),
        n_real,
        serve_log,
        verdicts,
    )


def report(
    args: argparse.Namespace,
    subs: list[Submitted],
    jobs: dict[str, Job],
    ledger: Ledger,
    restarts: list[tuple[float, float]],
    wall0: float,
    times: tuple[float, float, float],
    n_real: int,
    serve_log: str,
    mixed: Verdicts,
) -> int:
    acked = [s for s in subs if s.job_id]
    refused = [s for s in subs if s.refused]
    states = Counter(j.state.value for j in jobs.values())
    names = Counter(j.spec.name for j in jobs.values())
    down = [d for _, d in restarts]
    print(
        f"soak: {args.seconds:g}s at {args.rate:g} submits/s, {args.workers} polling workers "
        f"(+{args.real_workers} real), {len(restarts)} SIGKILL restarts of gpulayer serve, "
        f"retries={args.retries}"
    )
    window, cpu, waited = times
    print(
        f"submitting took {window:.1f}s (this process, fake workers and submitter: "
        f"{cpu:.1f} CPU-s, {100 * cpu / window:.0f}% of a core), settling {waited:.1f}s"
    )
    if down:
        print(
            f"restarts: at {', '.join(f'+{at:.1f}s' for at, _ in restarts)}; "
            f"down (kill to ready) p50 {statistics.median(down):.2f}s, max {max(down):.2f}s"
        )
    print(
        f"submitted {len(subs)}, acknowledged {len(acked)}, succeeded "
        f"{states.get('succeeded', 0)}; unacknowledged {len(subs) - len(acked)} "
        f"({len(refused)} refused"
        + (f", e.g. {refused[0].refused}" if refused else "")
        + f"); the server holds {len(jobs)} soak jobs "
        f"({sum(n - 1 for n in names.values())} extra from retried submits)"
    )
    print(f"final states: {dict(sorted(states.items()))}")
    n_runs = sum(len(r) for r in ledger.runs.values())
    busy = {r.worker for runs in ledger.runs.values() for r in runs}
    print(
        f"workers: {n_runs} runs on {len(busy)} workers ({n_real} by real workers), "
        f"{ledger.duplicates_ignored} duplicate assignments ignored while running, "
        f"{ledger.cancels} cancels, {ledger.rejoins} re-joins, {ledger.poll_errors} failed polls"
    )
    lat = [1000 * s.latency for s in acked]
    one = [1000 * s.last_try for s in acked]
    print(
        f"submit latency (acknowledged, from the first try): p50 {pct(lat, 0.5):.1f} ms, "
        f"p99 {pct(lat, 0.99):.1f} ms, max {max(lat, default=math.nan):.1f} ms; "
        f"the answered request alone: p50 {pct(one, 0.5):.1f} ms, p99 {pct(one, 0.99):.1f} ms; "
        f"{sum(1 for s in acked if s.tries > 1)} needed more than one try"
    )
    tracebacks = serve_log.count("Traceback (most recent call last)")
    if tracebacks:
        print(f"server log: {tracebacks} tracebacks")

    def detail(job_id: str) -> str:
        return describe_job(jobs[job_id], ledger.runs.get(job_id, []), wall0, restarts)

    lost = [
        f"    {s.job_id} {s.name}: acknowledged, not on the server"
        for s in acked
        if s.job_id not in jobs
    ]
    plain = [j for j in jobs.values() if not j.spec.labels.get("mix")]  # the mix judges its own
    lost += [detail(j.id) for j in plain if j.state == JobState.LOST]
    stuck = [detail(j.id) for j in plain if not j.state.terminal]
    double = 0
    doubled: list[str] = []
    for job_id, runs in ledger.runs.items():
        per_attempt = Counter(r.attempt for r in runs)
        extra = sum(n - 1 for n in per_attempt.values())
        if extra:
            double += extra
            doubled.append(detail(job_id) if job_id in jobs else f"    {job_id}: not a soak job?")
    # A retried submit that made a second job (each submit has its own name and key).
    extra = [
        f"    {name}: {n} jobs" for name, n in names.items() if n > 1 and name.startswith("soak-")
    ]
    if args.mix:
        print(
            f"mix: {dict(sorted(mixed.ok.items()))} ended with their own values; "
            f"{mixed.clean_errors} cells ended with the clear restart error"
        )
    show("lost", lost + mixed.lost)
    show(f"stuck (not final after {args.grace:g}s)", stuck + mixed.stuck)
    show("double (an attempt run more than once)", doubled)
    show("wrong (a value that belongs to another request)", mixed.wrong)
    show("extra (a second job or cell for one request)", extra + mixed.extra)
    total = len(lost) + len(mixed.lost) + len(stuck) + len(mixed.stuck) + double
    total += len(mixed.wrong) + len(extra) + len(mixed.extra)
    print(f"lost+stuck+double+wrong+extra = {total}")
    return total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=60.0, help="submitting window (default 60)")
    p.add_argument("--rate", type=float, default=50.0, help="submits per second (default 50)")
    p.add_argument("--workers", type=int, default=100, help="fake polling workers (default 100)")
    p.add_argument("--kills", type=int, default=10, help="SIGKILL restarts (default 10)")
    p.add_argument("--grace", type=float, default=60.0, help="seconds for jobs to end (60)")
    p.add_argument("--retries", type=int, default=0, help="the jobs' retries (default 0)")
    p.add_argument("--job-seconds", type=float, default=0.0, help="fake job length (0)")
    p.add_argument("--real-workers", type=int, default=0, help="add `gpulayer worker`s (0)")
    p.add_argument(
        "--mix",
        action="store_true",
        help="add chatty jobs, /jobs/run, batches and "
        "session cells on real workers (soak_mix.py; needs --real-workers >= 1)",
    )
    p.add_argument("--chatty-lines", type=int, default=100_000, help="a chatty job's lines")
    p.add_argument("--mix-every", type=float, default=1.0, help="seconds between mix requests")
    p.add_argument("--seed", type=int, default=None, help="the kill times' random seed")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (server log, homes)")
    p.add_argument("--quick", action="store_true", help="a smoke run: 10 s, 20/s, 10 workers")
    args = p.parse_args()
    if args.quick:
        args.seconds, args.rate, args.workers, args.kills, args.grace = 10.0, 20.0, 10, 2, 30.0
    if args.mix and args.real_workers < 1:
        args.real_workers = 1
    if args.seed is None:
        args.seed = random.randrange(1 << 30)
    print(f"kill times seeded with --seed {args.seed}")
    for var in ("GPULAYER_URL", "GPULAYER_TOKEN", "GPULAYER_HOME"):
        os.environ.pop(var, None)
    print(f"machine: {describe()}")
    d = tempfile.mkdtemp(prefix="gl-soak-")
    if args.keep:
        print(f"keeping {d} (server log, homes)")
    try:
        os.environ["GPULAYER_HOME"] = str(Path(d) / "default-home")
        asyncio.run(soak(args, Path(d)))
    finally:
        if not args.keep:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
