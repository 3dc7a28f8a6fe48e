"""The ``gpulayer`` command line: a thin edge that parses, calls the control plane, and prints.

Every command works against whichever control plane ``session.open_session`` finds: a served one
(``GPULAYER_URL``), the live owner of ``$GPULAYER_HOME``, or the embedded default in-process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import cli_server, render
from .contracts import Job, JobSpec, JobState, parse
from .errors import GPUlayerError
from .session import Session, open_session


def _env_pairs(values: Sequence[str], flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise GPUlayerError(
                f"{flag} {item!r} is not KEY=VALUE", hint=f"write it as {flag} NAME=value"
            )
        out[key] = value
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpulayer",
        description="Run jobs on the right GPU, from a terminal or from Jupyter.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run a command as a job and stream its logs")
    run.add_argument("--gpus", type=int, default=0, help="GPUs per node (default 0)")
    run.add_argument("--nodes", type=int, default=1, help="nodes for a multi-node gang")
    run.add_argument("--gpu-kind", default="", help="acceptable kinds in order, e.g. h100,a100")
    run.add_argument(
        "--fallback",
        choices=["cpu"],
        action="append",
        default=[],
        help="let a GPU job run on CPU when no GPU can take it",
    )
    run.add_argument("--timeout", type=float, default=None, help="seconds before it is killed")
    run.add_argument("--retries", type=int, default=0, help="re-runs after failure (opt-in)")
    run.add_argument("--env", action="append", default=[], metavar="K=V")
    run.add_argument("--secret", action="append", default=[], metavar="NAME")
    run.add_argument("--label", action="append", default=[], metavar="K=V")
    run.add_argument(
        "--selector", action="append", default=[], metavar="K=V", help="worker labels the job needs"
    )
    run.add_argument("--worker", default=None, help="run only on the worker with this name")
    run.add_argument("--name", default=None)
    run.add_argument("--priority", type=int, default=0)
    run.add_argument(
        "--workdir", default=None, help="directory on the worker (default: the current directory)"
    )
    run.add_argument("--detach", action="store_true", help="print the job id and return")
    run.add_argument("argv", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")

    jobs = sub.add_parser("jobs", help="list jobs")
    jobs.add_argument("--state", action="append", default=[], choices=[s.value for s in JobState])
    jobs.add_argument("--limit", type=int, default=20)
    jobs.add_argument("--json", action="store_true")

    logs = sub.add_parser("logs", help="show a job's logs")
    logs.add_argument("job")
    logs.add_argument("-f", "--follow", action="store_true", help="follow until the job ends")

    show = sub.add_parser("show", help="show one job in full (JSON)")
    show.add_argument("job")

    explain = sub.add_parser("explain", help="say why a job waits, or why it went where it went")
    explain.add_argument("job")

    cancel = sub.add_parser("cancel", help="cancel a job (stops its processes)")
    cancel.add_argument("job")

    workers = sub.add_parser("workers", help="list workers and their devices")
    workers.add_argument("--json", action="store_true")

    lab = sub.add_parser(
        "lab", help="start JupyterLab with GPUlayer on the embedded default, at the quickstart"
    )
    lab.add_argument("notebook", nargs="?", default=None, help="notebook to open")
    lab.add_argument("lab_args", nargs=argparse.REMAINDER, help="-- more `jupyter lab` options")
    cli_server.add_commands(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        handler = COMMANDS.get(args.command) or cli_server.COMMANDS[args.command]
        return asyncio.run(handler(args))
    except GPUlayerError as exc:
        print(f"gpulayer: error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"gpulayer: hint: {exc.hint}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _spec_from_args(args: argparse.Namespace) -> JobSpec:
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise GPUlayerError(
            "no command given", hint="write the command after --, e.g. gpulayer run -- python x.py"
        )
    return parse(
        JobSpec,
        {
            "name": args.name or os.path.basename(argv[0]),
            "workload": {"kind": "command", "argv": argv},
            "resources": {
                "gpus": args.gpus,
                "nodes": args.nodes,
                "gpu_kind": [k for k in args.gpu_kind.split(",") if k],
                "fallback": args.fallback,
                "selector": _env_pairs(args.selector, "--selector"),
                "worker": args.worker,
            },
            "env": _env_pairs(args.env, "--env"),
            "secrets": args.secret,
            "labels": _env_pairs(args.label, "--label"),
            "timeout": args.timeout,
            "retries": args.retries,
            "priority": args.priority,
            "workdir": args.workdir or os.getcwd(),
        },
    )


def _print_record(stream: str, text: str, rank: int | None) -> None:
    prefix = f"[rank {rank}] " if rank is not None else ""
    if stream == "stdout":
        sys.stdout.write(f"{prefix}{text}\n")
        sys.stdout.flush()
    else:
        tag = "gpulayer: " if stream == "system" else ""
        sys.stderr.write(f"{tag}{prefix}{text}\n")
        sys.stderr.flush()


async def _follow(s: Session, job_id: str, since: int = 0) -> Job:
    """Print log records as they arrive until the job ends and every line is printed."""
    while True:
        page = await s.logs(job_id, since=since, wait=25.0)
        for r in page.records:
            _print_record(r.stream, r.text, r.rank)
        since = page.next_since
        if page.state.terminal and not page.records:
            return await s.get(job_id)


async def _say_why_it_waits(s: Session, job_id: str, first: float = 0.5) -> None:
    """While the job waits to be placed, print the scheduler's sentence (again when it changes)."""
    said = ""
    delay = first
    while True:
        job = await s.wait(job_id, timeout=delay)
        if job.state != JobState.QUEUED:
            return
        sentence = await s.explain(job_id)
        if sentence != said:
            print(f"gpulayer: waiting: {sentence} (Ctrl-C cancels)", file=sys.stderr)
            said = sentence
        delay = 10.0


def exit_code_of(job: Job) -> int:
    if job.state == JobState.SUCCEEDED:
        return 0
    if job.state == JobState.CANCELLED:
        return 130
    if job.exit_code not in (None, 0):
        assert job.exit_code is not None
        return job.exit_code
    return 1


async def cmd_run(args: argparse.Namespace) -> int:
    spec = _spec_from_args(args)
    async with open_session(local_worker=True) as s:
        job = await s.submit(spec)
        if args.detach:
            print(job.id)
            return 0
        print(f"gpulayer: job {job.id} submitted ({spec.name})", file=sys.stderr)
        loop = asyncio.get_running_loop()
        follow = asyncio.create_task(_follow(s, job.id))
        watch = asyncio.create_task(_say_why_it_waits(s, job.id))
        interrupted = asyncio.Event()
        loop.add_signal_handler(signal.SIGINT, interrupted.set)
        loop.add_signal_handler(signal.SIGTERM, interrupted.set)
        try:
            stop = asyncio.create_task(interrupted.wait())
            done, _ = await asyncio.wait({follow, stop}, return_when=asyncio.FIRST_COMPLETED)
            if follow in done:
                stop.cancel()
                final = follow.result()
            else:
                print("\ngpulayer: interrupted; cancelling the job", file=sys.stderr)
                await s.cancel(job.id)
                # Keep printing what the job writes while it is being stopped.
                try:
                    final = await asyncio.wait_for(follow, 60.0)
                except TimeoutError:
                    final = await s.get(job.id)
        finally:
            watch.cancel()
            loop.remove_signal_handler(signal.SIGINT)
            loop.remove_signal_handler(signal.SIGTERM)
        if final.state != JobState.SUCCEEDED:
            why = f": {final.reason}" if final.reason else ""
            print(f"gpulayer: job {final.id} {final.state.value}{why}", file=sys.stderr)
        return exit_code_of(final)


async def cmd_jobs(args: argparse.Namespace) -> int:
    async with open_session() as s:
        jobs = await s.list(states=[JobState(x) for x in args.state], limit=args.limit)
    if args.json:
        print(json.dumps([j.model_dump(mode="json") for j in jobs], indent=2))
        return 0
    print(render.jobs_table(jobs))
    return 0


async def cmd_logs(args: argparse.Namespace) -> int:
    async with open_session() as s:
        job = await s.get(args.job)
        if args.follow:
            job = await _follow(s, job.id)
            return exit_code_of(job) if job.state.terminal else 0
        since = 0
        while True:
            page = await s.logs(job.id, since=since, limit=5000)
            for r in page.records:
                _print_record(r.stream, r.text, r.rank)
            if not page.records:
                return 0
            since = page.next_since


async def cmd_show(args: argparse.Namespace) -> int:
    async with open_session() as s:
        job = await s.get(args.job)
    data: dict[str, Any] = job.model_dump(mode="json")
    print(json.dumps(data, indent=2))
    return 0


async def cmd_explain(args: argparse.Namespace) -> int:
    async with open_session() as s:
        print(await s.explain(args.job))
    return 0


async def cmd_cancel(args: argparse.Namespace) -> int:
    async with open_session() as s:
        job = await s.cancel(args.job)
        if not job.state.terminal:
            job = await s.wait(job.id, timeout=30.0)
    print(f"job {job.id}: {job.state.value}")
    return 0


async def cmd_workers(args: argparse.Namespace) -> int:
    async with open_session() as s:
        workers = await s.workers()
    if args.json:
        print(json.dumps([w.model_dump(mode="json") for w in workers], indent=2))
        return 0
    print(render.workers_table(workers))
    return 0


async def cmd_lab(args: argparse.Namespace) -> int:
    """Replace this process with ``jupyter lab`` (the server extension hosts the control plane)."""
    notebook = args.notebook
    if notebook is None:
        quickstart = Path("notebooks/01-quickstart.ipynb")
        notebook = str(quickstart) if quickstart.exists() else None
    argv = [sys.executable, "-m", "jupyterlab"]
    if notebook:
        argv.append(notebook)
    if os.geteuid() == 0:
        argv.append("--allow-root")  # JupyterLab refuses root without it (containers, CI)
    extra = list(args.lab_args)
    argv.extend(extra[1:] if extra[:1] == ["--"] else extra)
    try:
        os.execv(sys.executable, argv)
    except OSError as exc:
        raise GPUlayerError(
            f"cannot start JupyterLab: {exc}", hint="install it with ./install.sh"
        ) from None
    return 0  # pragma: no cover - execv does not return


COMMANDS = {
    "run": cmd_run,
    "jobs": cmd_jobs,
    "logs": cmd_logs,
    "show": cmd_show,
    "explain": cmd_explain,
    "cancel": cmd_cancel,
    "workers": cmd_workers,
    "lab": cmd_lab,
}

if __name__ == "__main__":
    sys.exit(main())
