"""The soak's mixed work on real ``gpulayer worker`` processes (``soak.py --mix``).

Beside the steady one-shot submits that the fake workers take, these loops run through the same
server kills, each request with an idempotency key it keeps across its own retries:

* chatty jobs: a Python cell printing ``--chatty-lines`` lines, then its own tag as its value;
* ``/jobs/run``: a Python cell whose value is its own tag, submitted and followed in one call;
* batch submits (``/jobs/batch``): a few command jobs in one request;
* session cells in one session, every third one printing for a while (so kills land
  mid-output); each cell's value is ``n * 7919 + 13`` for its own ``n``.

Every request is an :class:`Expect`: what must come back. :func:`judge` sorts them at the end
into the soak's defects: *lost* (acknowledged, then missing, ``lost``, or failed), *stuck* (not
final after the grace period), *wrong* (a value that is not its own), *extra* (a second job or cell
for one request). A session cell that ends with the control plane's clear restart error is not a
defect: the issue allows it (ADR 0019); it is counted apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from gpulayer_kernel import bundles
from gpulayer_kernel.client.clients import AsyncClient
from gpulayer_kernel.contracts import (
    CellRequest,
    CommandWorkload,
    JobSpec,
    PythonWorkload,
    Resources,
    SessionHolder,
    SessionSpec,
)
from gpulayer_kernel.contracts.sessions import CellState, SessionStatus
from gpulayer_kernel.errors import GPUlayerError, Unavailable

T = TypeVar("T")
POOL = {"pool": "soak-real"}  # the real workers' label: only they run the mix's Python work
# A Python cell that writes down each run (like the command jobs), prints, and ends on its tag.
CELL = b"""import os
with open(runs_log, "a") as f:
    f.write(f"{os.environ['GPULAYER_JOB_ID']} {os.environ['GPULAYER_ATTEMPT']} mix\\n")
for i in range(lines):
    print(f"line {i} of {tag}")
tag
"""
CELL_DIGEST, CELL_BUNDLE = bundles.build({"cell.py": CELL})
RESTARTED = "control plane restarted"  # the clear error a cell may end with (ADR 0019)


def backoff(attempt: int) -> float:
    return min(0.5, 0.02 * 2.0 ** min(attempt, 5))


async def through(fn: Callable[[], Awaitable[T]], give_up: float) -> T:
    """Call ``fn`` until the server answers (it may be restarting); the same request each time."""
    attempt = 0
    while True:
        try:
            return await fn()
        except Unavailable:
            if time.monotonic() >= give_up:
                raise
            await asyncio.sleep(backoff(attempt))
            attempt += 1


@dataclass
class Expect:
    """One request of the mix and what must come back for it."""

    kind: str  # chatty | run | batch | cell
    name: str  # the job's name, or the cell's marker
    expected: str  # its value as text ("" for a command job: only its state counts)
    key: str = field(default_factory=lambda: uuid.uuid4().hex)
    job_id: str | None = None
    cell: int | None = None
    refused: str | None = None


@dataclass
class Mix:
    """The mix's settings and everything it asked for."""

    run_id: str
    runs_log: Path
    chatty_lines: int
    every: float  # seconds between two requests of each loop
    expects: list[Expect] = field(default_factory=list)
    session: str = ""

    def spec(self, name: str, tag: str, lines: int) -> JobSpec:
        return JobSpec(
            name=name,
            workload=PythonWorkload(
                bundle=CELL_DIGEST,
                entrypoint="cell:cell.py",
                args={"runs_log": str(self.runs_log), "lines": lines, "tag": tag},
            ),
            resources=Resources(selector=POOL),
            labels={"soak": self.run_id, "mix": "1"},
        )


async def _python_jobs(
    mix: Mix,
    until: float,
    give_up: float,
    kind: str,
    lines: int,
    send: Callable[[JobSpec, str], Awaitable[str]],
) -> None:
    """One Python job of ``kind`` every ``mix.every`` s, each through ``send`` (its job id)."""
    i = 0
    while time.monotonic() < until:
        e = Expect(kind, f"mix-{kind}-{i:04d}", f"{kind}-{mix.run_id}-{i}")
        mix.expects.append(e)
        spec = mix.spec(e.name, e.expected, lines)
        try:
            e.job_id = await through(partial(send, spec, e.key), give_up)
        except GPUlayerError as exc:
            e.refused = f"{type(exc).__name__}: {exc.message}"
        i += 1
        await asyncio.sleep(mix.every)


async def chatty(client: AsyncClient, mix: Mix, until: float, give_up: float) -> None:
    async def send(spec: JobSpec, key: str) -> str:
        return (await client.submit(spec, idempotency_key=key)).id

    await _python_jobs(mix, until, give_up, "chatty", mix.chatty_lines, send)


async def runs(client: AsyncClient, mix: Mix, until: float, give_up: float) -> None:
    async def send(spec: JobSpec, key: str) -> str:
        followed = await client.run(spec, CELL_BUNDLE, wait=5.0, idempotency_key=key)
        return followed.job.id

    await _python_jobs(mix, until, give_up, "run", 3, send)


async def batches(client: AsyncClient, mix: Mix, until: float, give_up: float) -> None:
    i = 0
    while time.monotonic() < until:
        es = [Expect("batch", f"mix-batch-{i:04d}-{k}", "") for k in range(4)]
        key = es[0].key  # one request, one key
        mix.expects += es
        specs = [
            JobSpec(
                name=e.name,
                workload=CommandWorkload(argv=["true"]),
                resources=Resources(selector=POOL),
                labels={"soak": mix.run_id, "mix": "1"},
            )
            for e in es
        ]
        try:
            answers = await through(
                partial(client.submit_many, specs, idempotency_key=key), give_up
            )
            for e, a in zip(es, answers, strict=True):
                if isinstance(a, GPUlayerError):
                    e.refused = a.message
                else:
                    e.job_id = a.id
        except GPUlayerError as exc:
            for e in es:
                e.refused = f"{type(exc).__name__}: {exc.message}"
        i += 1
        await asyncio.sleep(mix.every)


def cell_code(n: int, marker: str, chatty: bool) -> str:
    # A chatty cell prints for about a second, so the kills land mid-output now and then.
    loud = "import time\nfor i in range(40):\n    print('x' * 200, i)\n    time.sleep(0.025)\n"
    return f"# {marker}\n" + (loud if chatty else "") + f"{n} * 7919 + 13\n"


async def cells(client: AsyncClient, mix: Mix, until: float, give_up: float) -> None:
    holder = SessionHolder(client=f"soak-{mix.run_id}")
    spec = SessionSpec(
        name=f"soak-{mix.run_id}",
        holder=holder,
        resources=Resources(selector=POOL),
        labels={"soak": mix.run_id, "mix": "1"},
    )
    key = uuid.uuid4().hex
    info = await through(lambda: client.start_session(spec, idempotency_key=key), give_up)
    mix.session = info.name
    while info.status == SessionStatus.WAITING and time.monotonic() < give_up:
        await asyncio.sleep(0.2)
        info = await through(lambda: client.get_session(mix.session), give_up)
    n = 0
    while n == 0 or time.monotonic() < until:  # one cell at least, however slow the start
        n += 1
        e = Expect("cell", f"soak-cell-{mix.run_id}-{n}", str(n * 7919 + 13))
        mix.expects.append(e)
        request = CellRequest(code=cell_code(n, e.name, n % 3 == 0), client=holder.client)
        try:
            page = await through(
                partial(client.run_cell, mix.session, request, idempotency_key=e.key),
                give_up,
            )
        except GPUlayerError as exc:
            e.refused = f"{type(exc).__name__}: {exc.message}"
            if "ended" in exc.message:
                return  # the session is gone: nothing more to post
            continue
        e.cell = page.cell.number
        # Follow it to its end (through restarts) before posting the next: a notebook's way.
        while not page.cell.state.done and time.monotonic() < give_up:
            with contextlib.suppress(Unavailable):
                page = await client.follow_cell(mix.session, e.cell, page.next_since, wait=5.0)
        await asyncio.sleep(mix.every / 4)


async def drive(client: AsyncClient, mix: Mix, seconds: float, grace: float) -> None:
    """All four loops, for ``seconds``; each gives up on an unanswered request after ``grace``."""
    until = time.monotonic() + seconds
    give_up = until + grace
    await through(lambda: client.put_bundle(CELL_BUNDLE, CELL_DIGEST), give_up)
    loops = [chatty, runs, batches, cells]
    done = await asyncio.gather(
        *(loop(client, mix, until, give_up) for loop in loops), return_exceptions=True
    )
    for loop, outcome in zip(loops, done, strict=True):
        if isinstance(outcome, BaseException):
            print(f"mix: the {loop.__name__} loop failed: {outcome!r}")


@dataclass
class Verdicts:
    """The mix's defects, each a line that says what went wrong with which request."""

    lost: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    clean_errors: int = 0
    ok: Counter[str] = field(default_factory=Counter)


def _text(value: Any) -> str:
    """A job's result, or a cell's value (a MIME bundle: ``{"data": {"text/plain": …}}``)."""
    if isinstance(value, dict) and isinstance(value.get("data"), dict):
        value = value["data"]
    if isinstance(value, dict) and "text/plain" in value:
        return str(value["text/plain"]).strip("'\"")
    return "" if value is None else str(value)


async def judge(client: AsyncClient, mix: Mix, grace: float) -> Verdicts:
    """Wait (``grace`` s at most) for the mix's work to end, then judge every request."""
    v = Verdicts()
    give_up = time.monotonic() + grace
    jobs: dict[str, Any] = {}
    while time.monotonic() < give_up:
        listed = await through(
            lambda: client.list(label=("soak", mix.run_id), limit=10_000), give_up + 30
        )
        jobs = {j.id: j for j in listed if j.spec.labels.get("mix")}
        busy = [
            j for j in jobs.values() if not j.state.terminal and j.spec.workload.kind != "session"
        ]
        if not busy:
            break
        await asyncio.sleep(0.5)
    names = Counter(j.spec.name for j in jobs.values())
    v.extra += [f"    job {name}: {n} jobs for one request" for name, n in names.items() if n > 1]
    cells_by_marker: dict[str, list[Any]] = {}
    if mix.session:
        for c in await through(lambda: client.session_cells(mix.session, 10_000), give_up + 30):
            marker = c.code.split("\n", 1)[0].removeprefix("# ")
            cells_by_marker.setdefault(marker, []).append(c)
    for e in mix.expects:
        if e.kind == "cell":
            _judge_cell(e, cells_by_marker.get(e.name, []), v)
            continue
        if e.job_id is None:
            continue  # never acknowledged (refused or given up): not lost, nothing promised
        job = jobs.get(e.job_id)
        if job is None:
            v.lost.append(f"    {e.kind} {e.name} ({e.job_id}): acknowledged, not on the server")
        elif not job.state.terminal:
            v.stuck.append(f"    {e.kind} {e.name} ({e.job_id}): {job.state.value}")
        elif job.state.value != "succeeded":
            v.lost.append(f"    {e.kind} {e.name} ({e.job_id}): {job.state.value}: {job.reason}")
        elif e.expected and _text(job.result) != e.expected:
            v.wrong.append(f"    {e.kind} {e.name}: value {job.result!r}, not {e.expected!r}")
        else:
            v.ok[e.kind] += 1
    return v


def _judge_cell(e: Expect, found: list[Any], v: Verdicts) -> None:
    if len(found) > 1:
        v.extra.append(f"    cell {e.name}: {len(found)} cells ({[c.number for c in found]})")
    if e.cell is None:
        return  # never acknowledged
    mine = [c for c in found if c.number == e.cell]
    if not mine:
        v.lost.append(f"    cell {e.name} (number {e.cell}): not in the session's history")
        return
    c = mine[0]
    if not c.state.done:
        v.stuck.append(f"    cell {e.name} (number {c.number}): {c.state.value}")
    elif c.state == CellState.OK and _text(c.value) == e.expected:
        v.ok["cell"] += 1
    elif c.state == CellState.OK:
        v.wrong.append(
            f"    cell {e.name} (number {c.number}): value {c.value!r}, not {e.expected}"
        )
    elif RESTARTED in (c.reason or "") or RESTARTED in (c.error.evalue if c.error else ""):
        v.clean_errors += 1
    else:
        why = c.reason or (f"{c.error.ename}: {c.error.evalue}" if c.error else "?")
        v.lost.append(f"    cell {e.name} (number {c.number}): {c.state.value}: {why}")
