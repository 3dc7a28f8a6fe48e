"""``gpulayer run``: run a command as a job, stream its logs, say why it waits; Ctrl-C cancels.

The job does not inherit this shell's environment (it may run on another machine): ``--env NAME``
passes NAME's value from here, ``--env K=V`` a value. ``--files PATH...`` ships local files as a
content-addressed bundle (uploaded only when the control plane lacks it) and the command runs
inside the unpacked bundle on the worker, as a cell's ``--files`` do; without it the command runs
in ``--workdir`` (default: this directory, which must exist on the worker).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

from .. import jobopts
from ..client.connect import Connection, open_session
from ..contracts import JobSpec, JobState, parse
from ..errors import GPUlayerError, InvalidInput
from ..words import plain
from .common import Handler
from .jobs import exit_code_of, follow
from .live import LiveLine, watch


def add_parsers(sub: Any) -> None:
    """Add run to the ``gpulayer`` sub-parsers."""
    run = sub.add_parser("run", help="run a command as a job and stream its logs")
    jobopts.add_arguments(run, "cli")  # --gpus, --gpu-kind, ... (one table for every edge)
    run.add_argument("--name", default=None)
    run.add_argument(
        "--workdir", default=None, help="directory on the worker (default: the current directory)"
    )
    run.add_argument(
        "--files",
        nargs="+",
        action="extend",
        default=[],
        metavar="PATH",
        help="local files or folders shipped with the job; the command runs among them on the "
        "worker (end the list with --)",
    )
    run.add_argument("--detach", action="store_true", help="print the job id and return")
    run.add_argument("argv", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")


def _bundle(args: argparse.Namespace) -> tuple[str, bytes] | None:
    """``--files`` as a bundle (paths relative to this directory); None without ``--files``."""
    if not args.files:
        return None
    if args.workdir:
        raise InvalidInput(
            "--files and --workdir: a job with files runs in the folder they are unpacked to",
            hint="drop --workdir (paths in the command are relative to the shipped files)",
            details={"field": "--workdir"},
        )
    from .. import bundles

    return bundles.build_from_paths([Path(f) for f in args.files], Path.cwd())


def _spec_from_args(args: argparse.Namespace, bundle: str | None = None) -> JobSpec:
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise GPUlayerError(
            "no command given", hint="write the command after --, e.g. gpulayer run -- python x.py"
        )
    workload: dict[str, Any] = {"kind": "command", "argv": argv}
    if bundle is not None:
        workload["bundle"] = bundle
    fields = jobopts.job_fields(args, "cli")
    return parse(
        JobSpec,
        {
            **fields,
            "name": args.name or os.path.basename(argv[0]),
            "workload": workload,
            "workdir": None if bundle is not None else (args.workdir or os.getcwd()),
        },
    )


async def _say_why_it_waits(s: Connection, job_id: str, first: float = 0.5) -> None:
    """While the job waits to be placed, print the scheduler's sentence (again when it changes)."""
    said = ""
    delay = first
    while True:
        job = await s.wait(job_id, timeout=delay)
        if job.state != JobState.QUEUED:
            return
        sentence = await s.explain(job_id)
        if sentence != said:
            print(f"gpulayer: waiting: {plain(sentence)} (Ctrl-C cancels)", file=sys.stderr)
            said = sentence
        delay = 10.0


async def cmd_run(args: argparse.Namespace) -> int:
    bundle = _bundle(args)
    spec = _spec_from_args(args, bundle[0] if bundle is not None else None)
    async with open_session(local_worker=True) as s:
        if bundle is not None and not await s.has_bundle(bundle[0]):
            await s.put_bundle(bundle[1], bundle[0])
        job = await s.submit(spec)
        if args.detach:
            print(job.id)
            return 0
        print(f"gpulayer: job {job.id} submitted ({spec.name})", file=sys.stderr)
        loop = asyncio.get_running_loop()
        live = LiveLine(sys.stderr)
        following = asyncio.create_task(follow(s, job.id, live=live))
        waiting = asyncio.create_task(_say_why_it_waits(s, job.id))
        progress = asyncio.create_task(watch(s, job.id, live))
        # Progress is a nicety: if its stream fails, the logs and the outcome still come.
        progress.add_done_callback(lambda t: t.cancelled() or t.exception())
        interrupted = asyncio.Event()
        loop.add_signal_handler(signal.SIGINT, interrupted.set)
        loop.add_signal_handler(signal.SIGTERM, interrupted.set)
        try:
            stop = asyncio.create_task(interrupted.wait())
            done, _ = await asyncio.wait({following, stop}, return_when=asyncio.FIRST_COMPLETED)
            if following in done:
                stop.cancel()
                final = following.result()
            else:
                with live.above():
                    print("\ngpulayer: interrupted; cancelling the job", file=sys.stderr)
                await s.cancel(job.id)
                # Keep printing what the job writes while it is being stopped.
                try:
                    final = await asyncio.wait_for(following, 60.0)
                except TimeoutError:
                    final = await s.get(job.id)
        finally:
            waiting.cancel()
            progress.cancel()
            loop.remove_signal_handler(signal.SIGINT)
            loop.remove_signal_handler(signal.SIGTERM)
        live.close(final)
        if final.state != JobState.SUCCEEDED:
            why = f": {final.reason}" if final.reason else ""
            print(f"gpulayer: job {final.id} {final.state.value}{why}", file=sys.stderr)
        return exit_code_of(final)


COMMANDS: dict[str, Handler] = {"run": cmd_run}
