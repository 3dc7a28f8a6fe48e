"""``gpulayer jobs``, ``logs``, ``show``, ``explain``, ``cancel`` and ``workers``.

Also the log printing that ``gpulayer run`` shares: :func:`follow` and :func:`exit_code_of`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any

from ..client.connect import Connection, open_session
from ..contracts import Job, JobState
from ..errors import Unavailable
from ..words import plain
from .common import Handler
from .live import LiveLine


def add_parsers(sub: Any) -> None:
    """Add jobs, logs, show, explain, cancel and workers to the ``gpulayer`` sub-parsers."""
    jobs = sub.add_parser("jobs", help="list jobs")
    jobs.add_argument("--state", action="append", default=[], choices=[s.value for s in JobState])
    jobs.add_argument("--limit", type=int, default=20)
    jobs.add_argument("--json", action="store_true")

    logs = sub.add_parser("logs", help="show a job's logs")
    logs.add_argument("job")
    logs.add_argument("-f", "--follow", action="store_true", help="follow until the job ends")

    show = sub.add_parser("show", help="show one job in full (JSON)")
    show.add_argument("job")
    show.add_argument(
        "--attempts",
        action="store_true",
        help="its attempts as a table: how each ended, why, its estimate and charge",
    )

    explain = sub.add_parser("explain", help="say why a job waits, or why it went where it went")
    explain.add_argument("job")

    cancel = sub.add_parser("cancel", help="cancel a job (stops its processes)")
    cancel.add_argument("job")

    workers = sub.add_parser("workers", help="list workers and their devices")
    workers.add_argument("--json", action="store_true")
    workers_sub = workers.add_subparsers(dest="workers_command", metavar="{remove}")
    remove = workers_sub.add_parser(
        "remove",
        help="forget a worker and its stored record",
        description="Forget a worker (by id or name) and its stored record. One still running "
        "jobs is refused unless --force: its placed jobs go back to the queue, running ones "
        "are retried if they may, else lost. A worker process still running joins again as a "
        "new worker: stop it first.",
    )
    remove.add_argument("worker", metavar="ID|NAME")
    remove.add_argument("--force", action="store_true", help="take its jobs off it first")


def print_record(stream: str, text: str, rank: int | None) -> None:
    """Print one log line where the job wrote it: stdout to stdout, the rest to stderr.

    A progress bar's redraws (``\\r``) print as its last state (``render.visible``).
    """
    prefix = f"[rank {rank}] " if rank is not None else ""
    from .. import render

    text = render.visible(text)
    if stream == "stdout":
        sys.stdout.write(f"{prefix}{text}\n")
        sys.stdout.flush()
    else:
        tag = "gpulayer: " if stream == "system" else ""
        if tag:  # a note that names itself ("[gpulayer] …") says it once
            text = text.removeprefix("[gpulayer] ")
        sys.stderr.write(f"{tag}{prefix}{text}\n")
        sys.stderr.flush()


async def follow(s: Connection, job_id: str, since: int = 0, live: LiveLine | None = None) -> Job:
    """Print log records as they arrive until the job ends and every line is printed.

    With ``live`` (``gpulayer run``), the lines print above its progress line.
    """
    while True:
        page = await s.logs(job_id, since=since, wait=25.0)
        with live.above() if live is not None and page.records else contextlib.nullcontext():
            for r in page.records:
                print_record(r.stream, r.text, r.rank)
        since = page.next_since
        if page.state.terminal and not page.records:
            return await s.get(job_id)


def exit_code_of(job: Job) -> int:
    """The process exit status that tells a shell how the job ended (130: cancelled)."""
    if job.state == JobState.SUCCEEDED:
        return 0
    if job.state == JobState.CANCELLED:
        return 130
    if job.exit_code not in (None, 0):
        assert job.exit_code is not None
        return job.exit_code
    return 1


async def cmd_jobs(args: argparse.Namespace) -> int:
    async with open_session() as s:
        jobs = await s.list(states=[JobState(x) for x in args.state], limit=args.limit)
    if args.json:
        print(json.dumps([j.model_dump(mode="json") for j in jobs], indent=2))
        return 0
    from .. import render

    print(render.jobs_table(jobs))
    return 0


async def cmd_logs(args: argparse.Namespace) -> int:
    async with open_session() as s:
        job = await s.get(args.job)
        if args.follow:
            job = await follow(s, job.id)
            return exit_code_of(job) if job.state.terminal else 0
        since = 0
        while True:
            page = await s.logs(job.id, since=since, limit=5000)
            for r in page.records:
                print_record(r.stream, r.text, r.rank)
            if not page.records:
                return 0
            since = page.next_since


async def cmd_show(args: argparse.Namespace) -> int:
    async with open_session() as s:
        job = await s.get(args.job)
    if args.attempts:
        from .providers import attempts_text

        print(attempts_text(job))
        return 0
    data: dict[str, Any] = job.model_dump(mode="json")
    print(json.dumps(data, indent=2))
    return 0


async def cmd_explain(args: argparse.Namespace) -> int:
    async with open_session() as s:
        print(plain(await s.explain(args.job)))
    return 0


async def cmd_cancel(args: argparse.Namespace) -> int:
    async with open_session() as s:
        job = await s.cancel(args.job)
        if not job.state.terminal:
            try:
                job = await s.wait(job.id, timeout=30.0)
            except Unavailable:
                # The cancel was accepted; a `gpulayer run` that hosts the control plane exits as
                # soon as its job ends, and may do so before this wait is answered.
                print(
                    f"job {job.id}: cancel requested ({job.state.value}); the control plane "
                    "stopped before confirming it"
                )
                return 0
    print(f"job {job.id}: {job.state.value}")
    return 0


async def cmd_workers(args: argparse.Namespace) -> int:
    if getattr(args, "workers_command", None) == "remove":
        async with open_session() as s:
            gone = await s.remove_worker(args.worker, force=args.force)
        print(f"worker {gone.name} ({gone.id}) removed")
        return 0
    async with open_session() as s:
        workers = await s.workers()
    if args.json:
        print(json.dumps([w.model_dump(mode="json") for w in workers], indent=2))
        return 0
    from .. import render

    print(render.workers_table(workers))
    return 0


COMMANDS: dict[str, Handler] = {
    "jobs": cmd_jobs,
    "logs": cmd_logs,
    "show": cmd_show,
    "explain": cmd_explain,
    "cancel": cmd_cancel,
    "workers": cmd_workers,
}
