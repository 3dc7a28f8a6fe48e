"""The API for code running *inside* a GPUlayer job: arguments, result, progress, output dir.

A job talks back to its worker through a FIFO named by ``$GPULAYER_CONTROL`` (progress: one JSON
object per line, each under ``PIPE_BUF`` bytes where possible so that writes from several ranks
never interleave) and a result file named by ``$GPULAYER_RESULT`` (JSON, written by rank 0).
Outside a job (a plain notebook, a script) every call is a cheap no-op, so the same code runs
anywhere.

The package holds all that runs inside a job: this API, ``runner.py`` (what ``python -m
gpulayer_kernel.job.runner ENTRYPOINT`` runs) and ``ranks.py`` (the process-group helpers; it
imports torch, so nothing here imports it: ``import gpulayer_kernel.job`` stays light).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

CONTROL_ENV = "GPULAYER_CONTROL"
OUTPUT_ENV = "GPULAYER_OUTPUT"
ARGS_ENV = "GPULAYER_ARGS"
JOB_ID_ENV = "GPULAYER_JOB_ID"
RESULT_ENV = "GPULAYER_RESULT"

_fd: int | None = None
_fd_failed = False
_result_set = False
_result_value: Any = None


def in_job() -> bool:
    """True when this process runs as (a rank of) a GPUlayer job."""
    return JOB_ID_ENV in os.environ


def job_id() -> str | None:
    return os.environ.get(JOB_ID_ENV)


def args() -> dict[str, Any]:
    """The job's JSON arguments (``--in`` values of a cell, ``args`` of a PythonWorkload)."""
    raw = os.environ.get(ARGS_ENV)
    if not raw:
        return {}
    path = Path(raw)
    value = json.loads(path.read_text()) if path.is_file() else json.loads(raw)
    return value if isinstance(value, dict) else {}


def output_dir() -> Path:
    """Where to write files that should come back as artifacts (created on first use)."""
    path = Path(os.environ.get(OUTPUT_ENV) or "gpulayer-output")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _send(message: dict[str, Any]) -> bool:
    """Write one control message; False when there is no worker listening."""
    global _fd, _fd_failed
    path = os.environ.get(CONTROL_ENV)
    if not path or _fd_failed:
        return False
    if _fd is None:
        try:
            # O_NONBLOCK: with no reader, fail at once (ENXIO) instead of blocking the job forever.
            _fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            _fd_failed = True
            return False
    data = (json.dumps(message, allow_nan=False, separators=(",", ":")) + "\n").encode()
    try:
        view = memoryview(data)
        while view:
            try:
                n = os.write(_fd, view)
            except BlockingIOError:
                time.sleep(0.001)  # the worker drains the FIFO continuously; this is rare
                continue
            view = view[n:]
    except OSError:
        _fd_failed = True
        return False
    return True


def result(value: Any) -> None:
    """Set the job's result (JSON). In a distributed job, rank 0's result is the job's."""
    global _result_set, _result_value
    from ..contracts import ensure_json  # lazily: pydantic costs a job ~100 ms of start-up

    ensure_json(value, "result")
    _result_set, _result_value = True, value
    write_result(value)


def write_result(value: Any) -> None:
    """Write the result file the worker reads after the job exits (rank 0 only; atomic)."""
    path = os.environ.get(RESULT_ENV)
    if not path or _rank() != 0:
        return
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(value, f, allow_nan=False)
    os.replace(tmp, path)


def result_was_set() -> tuple[bool, Any]:
    return _result_set, _result_value


def progress(**fields: Any) -> None:
    """Report progress, e.g. ``progress(step=10, total=100, loss=0.3)``; shown in widgets.

    Only rank 0 reports. Values must be JSON (convert tensors with ``float(t)`` at log time, not
    per step: it forces a device sync).
    """
    if _rank() != 0:
        return
    from ..contracts import ensure_json

    ensure_json(fields, "progress")
    _send({"kind": "progress", "time": time.time(), "fields": fields})


# What torch says when code asks CUDA for a GPU that is simulated (vendor ``sim``: no CUDA here).
_NO_CUDA = (
    "Torch not compiled with CUDA enabled",
    "No CUDA GPUs are available",
    "no NVIDIA driver",
)


def simulated_note(message: str) -> str | None:
    """A word for an error that asked CUDA for a simulated GPU: they run on the CPU."""
    if os.environ.get("GPULAYER_SIMULATED") != "1" or not any(m in message for m in _NO_CUDA):
        return None
    return (
        "gpulayer: the GPUs of this job are simulated (vendor sim): the maths runs on the CPU, "
        "and CUDA is not there. Use gpulayer_kernel.torch.device() (or .to(device())) instead "
        "of .cuda(), so the same code runs on real and simulated GPUs"
    )
