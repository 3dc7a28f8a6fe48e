"""Plain-text rendering: the same facts the widget shows, as lines."""

from __future__ import annotations

import io

from gpulayer_kernel import render
from gpulayer_kernel.contracts import (
    Job,
    JobSpec,
    JobState,
    LogRecord,
    NodePlacement,
    Placement,
    PlacementReport,
    Reason,
    ReasonCount,
)

BUNDLE = "0" * 64


def make_job(gpus: int = 0, **fields: object) -> Job:
    spec = JobSpec.model_validate(
        {
            "name": "cell",
            "workload": {"kind": "python", "bundle": BUNDLE, "entrypoint": "cell:cell.py"},
            "resources": {"gpus": gpus},
        }
    )
    return Job.model_validate(
        {"id": "3f2a1b2c3d4e", "seq": 1, "spec": spec, "submitted_at": 100.0, **fields}
    )


def gang_placement() -> Placement:
    return Placement(
        nodes=[NodePlacement(worker_id="w", worker_name="local-vm", devices=[0, 1], simulated=True)]
    )


def test_placement_names_worker_devices_ranks_and_simulated() -> None:
    job = make_job(2, state=JobState.RUNNING, placement=gang_placement())
    assert render.placement(job) == "local-vm GPUs 0,1 (simulated) · ranks 0-1"
    assert render.ranks(job) == 2


def test_placement_cpu_fallback_and_unplaced() -> None:
    fallback = Placement(nodes=[NodePlacement(worker_id="w", worker_name="box", cpu_fallback=True)])
    assert render.placement(make_job(1, placement=fallback)) == "box on CPU (fallback)"
    assert render.placement(make_job()) == "-"


def test_progress_line() -> None:
    assert render.progress({"step": 30, "total": 100, "loss": 0.41234}) == (
        "step 30/100 (30%) · loss 0.4123"
    )
    assert render.progress({"epoch": 2}) == "epoch 2"
    assert render.progress(None) == ""


def test_state_line_and_summary() -> None:
    done = make_job(
        state=JobState.FAILED, started_at=100.0, finished_at=101.5, reason="exited with code 1"
    )
    assert render.state_line(done) == "job 3f2a1b2c3d4e (cell) failed in 1.50s: exited with code 1"
    report = PlacementReport(
        job_id="3f2a1b2c3d4e",
        workers_total=1,
        filtered=[
            ReasonCount(code=Reason.NO_GPUS, workers=1, detail="no GPUs", waiting_helps=False)
        ],
        sentence="0/1 workers can run job 3f2a1b: 1 has no GPUs",
    )
    waiting = make_job(1, pending=report)
    assert "waiting: 0/1 workers can run job 3f2a1b: 1 has no GPUs" in render.summary(waiting)


def test_duration() -> None:
    assert render.duration(0.213) == "0.21s"
    assert render.duration(12.34) == "12.3s"
    assert render.duration(125) == "2m 05s"
    assert render.duration(3720) == "1h 02m"


def test_text_view_streams_logs_in_order_with_rank_prefixes() -> None:
    out, err = io.StringIO(), io.StringIO()
    view = render.TextView(out, err)
    job = make_job(2, state=JobState.RUNNING, placement=gang_placement())
    view.update(job)
    view.add_logs(
        [
            LogRecord(seq=1, time=1.0, stream="system", text="placed on local-vm"),
            LogRecord(seq=2, time=1.0, stream="stdout", rank=0, text="hello"),
            LogRecord(seq=3, time=1.0, stream="stderr", rank=1, text="oops"),
            LogRecord(seq=4, time=1.0, stream="stdout", rank=1, text="bye"),
        ]
    )
    view.finish(
        job.model_copy(update={"state": JobState.SUCCEEDED, "started_at": 1.0, "finished_at": 2.0})
    )
    assert out.getvalue().splitlines() == [
        "gpulayer: job 3f2a1b2c3d4e submitted (cell)",
        "gpulayer: placed on local-vm",
        "[rank 0] hello",
        "[rank 1] bye",
        "gpulayer: job 3f2a1b2c3d4e (cell) succeeded in 1.00s",
    ]
    assert err.getvalue() == "[rank 1] oops\n"


def test_text_view_says_why_a_job_waits_once() -> None:
    out = io.StringIO()
    view = render.TextView(out, io.StringIO())
    report = PlacementReport(
        job_id="3f2a1b2c3d4e",
        sentence="0/1 workers can run job 3f2a1b",
        filtered=[ReasonCount(code=Reason.NO_GPUS, workers=1, detail="x", waiting_helps=False)],
        workers_total=1,
    )
    job = make_job(1, pending=report)
    view.update(job)
    view.update(job)
    text = out.getvalue()
    assert text.count("waiting: 0/1 workers can run job 3f2a1b (waiting won't help") == 1
    assert "%gpulayer cancel 3f2a1b2c3d4e" in text
