"""Reports over each limit the server enforces (contracts/limits.py): refused when sent raw, taken
when the worker splits them (HttpTransport, Reporter, LogShipper) against a real API server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from gpulayer_kernel.contracts import (
    CommandWorkload,
    FinishReport,
    JobSpec,
    JobState,
    LogLine,
    WorkerRegistration,
)
from gpulayer_kernel.contracts.limits import (
    JOB_LOG_CAP,
    LINE_PIECE,
    MAX_BODY,
    MAX_LINE_CHARS,
    MAX_LINES,
    SERVER_SLACK,
)
from gpulayer_kernel.display import human_bytes
from gpulayer_kernel.redact import Redactor
from gpulayer_kernel.worker.http import HttpTransport
from gpulayer_kernel.worker.logship import LogShipper
from gpulayer_kernel.worker.reports import Reporter

from ..api.conftest import Api, running_api


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(tmp_path, heartbeat_timeout=30.0) as a:
        yield a


@pytest.fixture
async def worker(api: Api) -> AsyncIterator[HttpTransport]:
    t = HttpTransport(api.url, api.join_token, retry_for=5)
    await t.register(WorkerRegistration(name="w"))
    try:
        yield t
    finally:
        await t.close()


async def running_job(api: Api, t: HttpTransport) -> tuple[str, int]:
    """A job placed on the worker ``t`` (nothing runs it: the test reports for it)."""
    job = await api.cp.submit(
        JobSpec(workload=CommandWorkload(argv=["true"]), resources={"worker": "w"})  # type: ignore[arg-type]
    )
    work = await t.next_work(5)
    (a,) = work.assignments
    assert a.job.id == job.id
    await t.report_started(job.id, a.attempt)
    return job.id, a.attempt


def line(text: str, n: int = 0) -> LogLine:
    # Built as a worker builds them (unchecked): some are over a limit on purpose.
    return LogLine.model_construct(
        time=1000.0 + n, stream="stdout", rank=None, text=text, cell=None, data=None
    )


async def raw(api: Api, t: HttpTransport, path: str, body: bytes) -> httpx.Response:
    return await api.http.post(
        api.base + path,
        content=body,
        headers={"Authorization": f"Bearer {t.session_token}", "Content-Type": "application/json"},
        timeout=60,
    )


async def texts(api: Api, job_id: str) -> list[str]:
    out: list[str] = []
    since = 0
    while True:
        page = await api.cp.logs(job_id, since=since, limit=5_000)
        if not page.records:
            return out
        out += [r.text for r in page.records if r.stream == "stdout"]
        since = page.next_since


@pytest.mark.slow  # ~2 s with two xdist workers on two cores
async def test_too_many_lines_refused_raw_and_taken_when_split(
    api: Api, worker: HttpTransport
) -> None:
    job_id, attempt = await running_job(api, worker)
    n = MAX_LINES * 2 + 7
    lines = [line(f"l{i}", i) for i in range(n)]
    entry = {"job_id": job_id, "attempt": attempt, "lines": [x.model_dump() for x in lines]}
    resp = await raw(api, worker, "/worker/reports", json.dumps({"reports": [entry]}).encode())
    refused = resp.json()["refused"]
    assert refused[0]["code"] == "validation_failed" and "at most 10000" in refused[0]["message"]
    resp = await raw(
        api, worker, f"/worker/jobs/{job_id}/logs", json.dumps({"lines": entry["lines"]}).encode()
    )
    assert resp.status_code == 422, resp.text

    # The reporter splits the attempt's lines over consecutive batches, its end with the last.
    sent: list[int] = []

    async def send(reports):  # type: ignore[no-untyped-def]
        sent.append(sum(len(r.lines) for r in reports))
        assert all(len(r.lines) <= MAX_LINES for r in reports)
        return await worker.report(reports)

    reporter = Reporter(send)
    reporter.logs(job_id, attempt, lines)
    await reporter.finished(job_id, attempt, FinishReport(state="succeeded", exit_code=0))
    assert sum(sent) == n and len(sent) >= 3
    job = await api.cp.get(job_id)
    assert job.state == JobState.SUCCEEDED
    assert await texts(api, job_id) == [f"l{i}" for i in range(n)]


async def test_an_over_long_line_refused_raw_and_taken_in_pieces(
    api: Api, worker: HttpTransport
) -> None:
    job_id, attempt = await running_job(api, worker)
    long = "ab" * (MAX_LINE_CHARS // 2) + "c"  # one character over the limit
    body = json.dumps({"attempt": attempt, "lines": [line(long).model_dump()]}).encode()
    with pytest.raises(ValueError, match="at most 1048576 characters"):
        LogLine(time=1.0, stream="stdout", text=long)
    resp = await raw(api, worker, f"/worker/jobs/{job_id}/logs", body)
    assert resp.status_code == 422 and resp.json()["code"] == "validation_failed", resp.text

    shipper = LogShipper(lambda ls: worker.append_logs(job_id, ls, attempt), Redactor({}))
    shipper.add("stdout", long)
    await shipper.close()
    got = await texts(api, job_id)
    assert len(got) == -(-len(long) // LINE_PIECE) and all(len(t) <= LINE_PIECE for t in got)
    assert "".join(got) == long
    # The transport cuts lines that did not go through a shipper too.
    await worker.append_logs(job_id, [line("z" * (MAX_LINE_CHARS + 5))], attempt)
    assert "".join(await texts(api, job_id)) == long + "z" * (MAX_LINE_CHARS + 5)


async def test_an_over_large_body_refused_raw_and_taken_when_split(
    api: Api, worker: HttpTransport
) -> None:
    job_id, attempt = await running_job(api, worker)
    # Control characters take six bytes each in JSON: a guess from the text's length is wrong.
    text = "\x01" * (LINE_PIECE - 1)
    lines = [line(text + str(i % 10), i) for i in range(30)]
    body = json.dumps({"attempt": attempt, "lines": [x.model_dump() for x in lines]}).encode()
    assert len(body) > MAX_BODY
    resp = await raw(api, worker, f"/worker/jobs/{job_id}/logs", body)
    assert resp.status_code == 413 and resp.json()["code"] == "body_too_large", resp.text

    await worker.append_logs(job_id, lines, attempt)
    assert await texts(api, job_id) == [x.text for x in lines]
    # The same through the reporter: batches cut on the measured size, the end with the last.
    bodies: list[int] = []

    async def send(reports):  # type: ignore[no-untyped-def]
        bodies.append(sum(len(r.model_dump_json(exclude_none=True)) for r in reports))
        return await worker.report(reports)

    reporter = Reporter(send)
    reporter.logs(job_id, attempt, lines)
    await reporter.finished(job_id, attempt, FinishReport(state="succeeded", exit_code=0))
    assert len(bodies) >= 2 and max(bodies) <= MAX_BODY
    assert await texts(api, job_id) == [x.text for x in lines] * 2
    assert (await api.cp.get(job_id)).state == JobState.SUCCEEDED


async def test_the_server_stores_no_more_than_a_job_s_cap(api: Api, worker: HttpTransport) -> None:
    """A worker that does not cap its output cannot fill the control plane's disk."""
    job_id, attempt = await running_job(api, worker)
    chunk = [line("y" * (LINE_PIECE - 1), i) for i in range(100)]  # ~6.4 MiB
    for _ in range((JOB_LOG_CAP + SERVER_SLACK) // (100 * LINE_PIECE) + 3):
        await worker.append_logs(job_id, chunk, attempt)
    records = []  # page by page: a page carries a few MiB at most (issue 32)
    while page := (await api.cp.logs(job_id, since=records[-1].seq if records else 0)).records:
        records += page
    stored = sum(len(r.text) for r in records if r.stream == "stdout")
    assert JOB_LOG_CAP <= stored <= JOB_LOG_CAP + SERVER_SLACK
    notes = [r.text for r in records if r.text.startswith("[gpulayer]")]
    assert len(notes) == 1 and f"capped at {human_bytes(JOB_LOG_CAP)}" in notes[0], notes
