"""Plain structs on the hot paths? pydantic against msgspec and slotted dataclasses (issue 35).

    .venv/bin/python benchmarks/bench_structs.py [--rounds N]

The messages a busy control plane handles most, each the way the code handles it today beside
the same shape as a ``msgspec.Struct`` and a ``@dataclass(slots=True)``, in interleaved rounds:

1. **a worker's report entry** (``JobReport``: 50 log lines and an end) decoded from JSON and
   checked, as the server takes every entry of ``POST /worker/reports``;
2. **a log record built and encoded** (``LogRecord``, built unchecked as ``logs.py`` does, then
   ``model_dump_json``), as every line of a chatty job is;
3. **a cell run copied with an update** (``CellRun.model_copy(update=...)``), as a session cell's
   life does a handful of times.

Each line: µs per operation for each way, and the ratio pydantic / msgspec. The last line is
the geometric mean of those ratios. msgspec is only needed to run this (``pip install msgspec``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import msgspec
from _machine import describe

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpulayer_kernel.contracts import CellRun, CellState, JobReport, LogRecord
from gpulayer_kernel.contracts._base import built


class LineS(msgspec.Struct, omit_defaults=True):
    time: float
    stream: Literal["stdout", "stderr", "system", "display", "progress"]
    text: str
    rank: int | None = None
    cell: int | None = None
    data: dict[str, Any] | None = None


class FinishS(msgspec.Struct, omit_defaults=True):
    state: Literal["succeeded", "failed", "cancelled"]
    exit_code: int | None = None
    reason: str | None = None
    result: Any = None


class ReportS(msgspec.Struct, omit_defaults=True):
    job_id: str
    attempt: int | None = None
    started: bool = False
    lines: list[LineS] = []
    progress: dict[str, Any] | None = None
    finished: FinishS | None = None


class RecordS(msgspec.Struct, omit_defaults=True):
    seq: int
    time: float
    stream: str
    text: str
    rank: int | None = None
    cell: int | None = None
    data: dict[str, Any] | None = None


@dataclasses.dataclass(slots=True)
class RecordD:
    seq: int
    time: float
    stream: str
    text: str
    rank: int | None = None
    cell: int | None = None
    data: dict[str, Any] | None = None


def per_op(fn: Callable[[], object], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--n", type=int, default=2000)
    args = p.parse_args()
    print(f"machine: {describe()}; msgspec {msgspec.__version__}")

    lines = [
        {"time": 1.5 + i, "stream": "stdout", "text": f"step {i} loss 0.{i:04d}"} for i in range(50)
    ]
    entry = json.dumps(
        {
            "job_id": "3f2a9c1e7b10",
            "attempt": 0,
            "started": True,
            "lines": lines,
            "finished": {"state": "succeeded", "exit_code": 0},
        }
    ).encode()
    report_decoder = msgspec.json.Decoder(ReportS)
    record_encoder = msgspec.json.Encoder()
    fields = {"seq": 7, "time": 2.5, "stream": "stdout", "rank": 0, "text": "step 7 loss 0.25"}
    cell = CellRun(
        session_id="s" * 12,
        number=3,
        state=CellState.RUNNING,
        code="x += 1; x",
        code_sha256="0" * 64,
        submitted_at=1.0,
    )
    cell_s = msgspec.convert(cell.model_dump(mode="json"), type=dict)

    cases: dict[str, dict[str, Callable[[], object]]] = {
        "report entry decoded and checked": {
            "pydantic": lambda: JobReport.model_validate_json(entry),
            "msgspec": lambda: report_decoder.decode(entry),
        },
        "log record built and encoded": {
            "pydantic": lambda: built(
                LogRecord, {**fields, "cell": None, "data": None}
            ).model_dump_json(),
            "msgspec": lambda: record_encoder.encode(RecordS(**fields)),
            "dataclass": lambda: json.dumps(dataclasses.asdict(RecordD(**fields))),
        },
        "cell run copied with an update": {
            "pydantic": lambda: cell.model_copy(update={"state": CellState.OK, "number": 4}),
            "msgspec": lambda: {**cell_s, "state": "ok", "number": 4},
        },
    }
    ratios = []
    for name, ways in cases.items():
        for fn in ways.values():
            per_op(fn, args.n // 4)  # warm up
        per: dict[str, list[float]] = {w: [] for w in ways}
        for _ in range(args.rounds):
            for way, fn in ways.items():
                per[way].append(per_op(fn, args.n))
        med = {w: statistics.median(v) for w, v in per.items()}
        ratio = med["pydantic"] / med["msgspec"]
        ratios.append(ratio)
        shown = ", ".join(f"{w} {v:.2f} µs" for w, v in med.items())
        print(f"{name}: {shown}; pydantic / msgspec {ratio:.1f}×")
    geo = statistics.geometric_mean(ratios)
    print(f"pydantic / msgspec on the hot paths: {geo:.1f}× (geometric mean)")


if __name__ == "__main__":
    main()
