"""What ``fit(ckpt_path=...)`` resumes from, and whether the config still fits the checkpoint.

``ckpt_path`` may be a checkpoint dict, a file, ``"last"`` / ``"best"`` (this Trainer's
ModelCheckpoint, else the newest file in the checkpoint directory), an artifact name of this
job (``step-00000300.pt``, ``rank0/step-00000300.pt``: a file under ``$GPULAYER_OUTPUT``), or
``"JOB_ID:ARTIFACT"``: another job's artifact, fetched from the control plane this process
finds (``GPULAYER_URL``, else the one owning ``$GPULAYER_HOME``).
"""

from __future__ import annotations

import asyncio
import re
import tempfile
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .. import job
from .checkpoint import SHARDED_REST, SHARDED_SUFFIX, load_checkpoint
from .config import EXACT_FIELDS, TrainerConfig
from .errors import CheckpointInvalid, ConfigChanged

_JOB_ARTIFACT = re.compile(r"^([0-9a-f]{8,32}):(.+)$")
_HINT = (
    "pass a checkpoint file, 'last', 'best', an artifact name of this job, or "
    "'JOB_ID:ARTIFACT' (list a job's artifacts with: gpulayer artifacts JOB_ID)"
)


def resolve(
    source: str | Path | Mapping[str, Any],
    directory: Path,
    best: str | None,
    last: str | None,
) -> dict[str, Any]:
    """Load the checkpoint ``source`` names (``directory``: where this fit saves)."""
    if isinstance(source, Mapping):
        return load_checkpoint(source)
    text = str(source)
    if text == "best":
        if best is None:
            raise CheckpointInvalid(
                "ckpt_path='best': no best checkpoint yet (a ModelCheckpoint with a monitor "
                "keeps one)",
                hint="fit with ModelCheckpoint(monitor='val_loss') first, or pass 'last' or a path",
            )
        return load_checkpoint(best)
    if text == "last":
        return load_checkpoint(last or _newest(directory))
    path = Path(text)
    if path.exists():  # a file, or a sharded checkpoint's directory
        return load_checkpoint(path)
    for candidate in _artifact_paths(text):
        if candidate.exists():
            return load_checkpoint(candidate)
    match = _JOB_ARTIFACT.match(text)
    if match:
        return _fetch(match.group(1), match.group(2))
    raise CheckpointInvalid(f"no checkpoint at {text}: no such file or artifact", hint=_HINT)


def _newest(directory: Path) -> Path:
    files = (
        [p for p in directory.glob("*.pt") if p.is_file()]
        + [p for p in directory.glob(f"*{SHARDED_SUFFIX}") if (p / SHARDED_REST).is_file()]
        if directory.is_dir()
        else []
    )
    if not files:
        raise CheckpointInvalid(
            f"ckpt_path='last': no checkpoint in {directory}",
            hint="save one first (checkpoint_every, ModelCheckpoint), or pass a path",
        )
    return max(files, key=lambda p: (p.stat().st_mtime_ns, p.name))


def _artifact_paths(name: str) -> list[Path]:
    """Where an artifact named ``name`` of this job lies (a gang's rank writes under rankR)."""
    out = job.output_dir()
    paths = [out / name]
    if re.match(r"^rank\d+/", name) and re.fullmatch(r"rank\d+", out.name):
        paths.append(out.parent / name)
    return paths


def _fetch(job_id: str, name: str) -> dict[str, Any]:
    """Download another job's artifact into a temp file and load it (weights_only)."""
    from ..artifacts import download, find_artifact
    from ..client.connect import open_session

    async def fetch(dest: Path) -> None:
        async with open_session() as s:
            artifact = find_artifact(await s.get(job_id), name)
            with dest.open("wb") as f:
                await download(s, artifact, f)

    with tempfile.TemporaryDirectory(prefix="gpulayer-ckpt-") as tmp:
        dest = Path(tmp) / "checkpoint.pt"
        errors: list[BaseException] = []

        def run() -> None:  # a thread: the caller may already run an event loop (a kernel)
            try:
                asyncio.run(fetch(dest))
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=run, name="gpulayer-fetch-checkpoint")
        thread.start()
        thread.join()
        if errors:
            raise errors[0]
        checkpoint = load_checkpoint(dest)
    return checkpoint


def check_config(
    saved: Mapping[str, Any] | None, current: TrainerConfig, override: Iterable[str]
) -> None:
    """Raise :class:`ConfigChanged` when a field that changes the maths differs, unless named."""
    allowed = set(override)
    unknown = sorted(allowed - set(EXACT_FIELDS))
    if unknown:
        raise ConfigChanged(
            f"override names {', '.join(map(repr, unknown))}, which resume never checks",
            hint=f"override takes some of: {', '.join(EXACT_FIELDS)}; the others may change freely",
            details={"override": unknown},
        )
    if not saved:
        return
    now = current.model_dump(mode="json")
    changed = {
        key: (saved.get(key), now[key])
        for key in EXACT_FIELDS
        if key in saved and saved.get(key) != now[key] and key not in allowed
    }
    if changed:
        said = ", ".join(f"{key} {old!r} -> {new!r}" for key, (old, new) in changed.items())
        names = ", ".join(repr(key) for key in changed)
        raise ConfigChanged(
            f"resuming under a changed TrainerConfig ({said}): these change what each step "
            "computes, so the run would not continue the saved one",
            hint=f"train with the saved values, or pass override=({names},) to fit() to "
            "resume anyway",
            details={"changed": {k: list(v) for k, v in changed.items()}},
        )
