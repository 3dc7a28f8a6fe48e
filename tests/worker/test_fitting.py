"""The worker's cuts to fit the control plane's limits (worker/fitting.py, worker/reports.py):
every piece fits every limit, the pieces put together are the original, in order."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulayer_kernel.contracts import FinishReport, JobReport, LogLine
from gpulayer_kernel.contracts.limits import MAX_BODY, MAX_LINES
from gpulayer_kernel.errors import GPUlayerError
from gpulayer_kernel.worker.fitting import fit_lines, line_json, make_line, runs, utf8_len
from gpulayer_kernel.worker.reports import Reporter

TEXT = st.text(st.characters(codec="utf-8"), max_size=300)


def lines_of(texts: Sequence[str]) -> list[LogLine]:
    return [make_line(float(i), "stdout", t) for i, t in enumerate(texts)]


def test_make_line_is_model_construct() -> None:
    fast = make_line(1.5, "stderr", "hi", 2, 3)
    slow = LogLine.model_construct(time=1.5, stream="stderr", rank=2, text="hi", cell=3)
    assert fast == slow and line_json(fast) == line_json(slow)
    assert LogLine.model_validate_json(line_json(fast)) == slow


@given(st.lists(TEXT, max_size=40), st.integers(1, 50))
def test_fit_lines_cuts_every_line_and_loses_nothing(texts: list[str], size: int) -> None:
    out = fit_lines(lines_of(texts), size)
    assert all(len(x.text) <= size for x in out)
    joined: dict[float, str] = {}
    for x in out:
        joined[x.time] = joined.get(x.time, "") + x.text
    assert [joined.get(float(i), "") for i in range(len(texts))] == texts
    assert [x.time for x in out] == sorted(x.time for x in out)  # pieces stay in order


@given(st.lists(st.integers(1, 100), max_size=60), st.integers(1, 300), st.integers(1, 10))
def test_runs_fit_and_cover_everything_in_order(sizes: list[int], most: int, items: int) -> None:
    out = runs(sizes, most, items)
    assert [i for r in out for i in r] == list(range(len(sizes)))
    for r in out:
        assert len(r) <= items
        assert sum(sizes[i] for i in r) <= most or len(r) == 1  # an item too large goes alone


@pytest.mark.slow  # ~3 s with two xdist workers on two cores
@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.integers(0, 5_000), min_size=1, max_size=6),
    st.integers(0, 3),
    st.integers(1_000, 60_000),
)
def test_the_reporter_sends_batches_that_fit_and_keeps_order(
    counts: list[int], width: int, size: int
) -> None:
    """Several attempts' lines, far over the limits: every batch fits, every attempt's lines
    arrive once each in order, and each end comes with or after its last line."""
    text = "é\x01" * width  # two bytes and six bytes of JSON: the measure must be the real one

    async def main() -> None:
        seen: dict[str, list[str]] = {}
        ended: dict[str, int] = {}

        async def send(reports: Sequence[JobReport]) -> list[GPUlayerError | None]:
            body = '{"reports":[' + ",".join(r.model_dump_json(exclude_none=True) for r in reports)
            assert utf8_len(body) + 2 <= MAX_BODY
            assert len({r.job_id for r in reports}) == len(reports)  # an attempt once a batch
            for r in reports:
                assert len(r.lines) <= MAX_LINES and r.job_id not in ended
                seen.setdefault(r.job_id, []).extend(x.text for x in r.lines)
                if r.finished is not None:
                    ended[r.job_id] = len(seen[r.job_id])
            return [None] * len(reports)

        reporter = Reporter(send, linger=0)
        waits = []
        for j, n in enumerate(counts):
            big = [make_line(0.0, "stdout", f"{j}:{i}:" + text * (size // 100)) for i in range(n)]
            reporter.logs(f"job{j}", 0, big[: n // 2])
            reporter.logs(f"job{j}", 0, big[n // 2 :])
            waits.append(reporter.finished(f"job{j}", 0, FinishReport(state="succeeded")))
        await asyncio.gather(*waits)
        for j, n in enumerate(counts):
            want = [f"{j}:{i}:" + text * (size // 100) for i in range(n)]
            assert seen.get(f"job{j}", []) == want and ended[f"job{j}"] == n

    asyncio.run(main())
