"""``gpulayer artifacts JOB``: list a job's artifacts; ``--get NAME [-o PATH]`` downloads one.

A download streams into a temporary file beside the destination, is checked against the
artifact's digest, and only then takes the destination's name: an interrupted or corrupt
download never leaves a half file under the real name. An existing file is kept unless
``--force``; ``-o -`` writes to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..artifacts import download, find_artifact
from ..client.connect import Connection, open_session
from ..contracts import Artifact
from ..errors import Conflict
from .common import Handler


def add_parsers(sub: Any) -> None:
    """Add artifacts to the ``gpulayer`` sub-parsers."""
    p = sub.add_parser(
        "artifacts",
        help="list a job's artifacts, or download one (--get NAME)",
        description="A job's artifacts are the files it wrote to $GPULAYER_OUTPUT.",
    )
    p.add_argument("job", help="job id (or a unique prefix)")
    p.add_argument("--get", metavar="NAME", default=None, help="download the artifact NAME")
    p.add_argument(
        "-o",
        "--output",
        metavar="PATH",
        default=None,
        help="where to save it (default: its file name here; a folder: inside it; -: stdout)",
    )
    p.add_argument("--force", action="store_true", help="replace PATH if it exists")
    p.add_argument("--json", action="store_true", help="list as JSON")


def destination(artifact: Artifact, output: str | None) -> Path:
    """Where ``--get`` saves ``artifact``: ``-o PATH``, inside ``PATH`` if it is a folder, or
    the artifact's file name in the current directory."""
    base = Path(artifact.name).name
    if output is None:
        return Path(base)
    path = Path(output)
    return path / base if path.is_dir() else path


async def _download(s: Connection, artifact: Artifact, output: str | None, force: bool) -> None:
    if output == "-":
        await download(s, artifact, sys.stdout.buffer)
        sys.stdout.flush()
        return
    dest = destination(artifact, output)
    if dest.exists() and not force:
        raise Conflict(
            f"{dest} exists; not overwriting it with artifact {artifact.name}",
            hint="pass --force to replace it, or -o PATH to save elsewhere",
            details={"path": str(dest), "artifact": artifact.name},
            code="file_exists",
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            await download(s, artifact, f)
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    from .. import render

    print(f"gpulayer: saved {artifact.name} ({render.size(artifact.size)}) to {dest}")


async def cmd_artifacts(args: argparse.Namespace) -> int:
    from .. import render

    async with open_session() as s:
        job = await s.get(args.job)
        if args.get is not None:
            await _download(s, find_artifact(job, args.get), args.output, args.force)
            return 0
    if args.json:
        print(json.dumps([a.model_dump(mode="json") for a in job.artifacts], indent=2))
    else:
        print(render.artifacts_table(job))
    return 0


COMMANDS: dict[str, Handler] = {"artifacts": cmd_artifacts}
