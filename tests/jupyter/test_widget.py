"""The job widget's Python side: traits from jobs, log appends, the idle-kernel cancel path."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpulayer_kernel.contracts import (
    Job,
    JobState,
    LogRecord,
    NodePlacement,
    Placement,
    PlacementReport,
)
from gpulayer_kernel.jupyter.bridge import Target, Update
from gpulayer_kernel.jupyter.widget import JobWidget, rest_cancel_path

from ..test_render import make_job


class FakeBridge:
    """Just what the widget uses: where it is connected, and cancel."""

    def __init__(self, target: Target | None = None, embedded: bool = True) -> None:
        self.target = target or Target()
        self.embedded = embedded
        self.cancelled: list[str] = []

    def cancel(self, job_id: str, reason: str = "") -> Job:
        self.cancelled.append(job_id)
        return make_job(state=JobState.CANCELLED)


def widget(job: Job, bridge: FakeBridge | None = None) -> tuple[JobWidget, list[Any]]:
    w = JobWidget(bridge or FakeBridge(), job, blocking=True)  # type: ignore[arg-type]
    sent: list[Any] = []
    w.send = sent.append  # type: ignore[method-assign]
    return w, sent


def test_waiting_job_shows_its_reason() -> None:
    report = PlacementReport(
        job_id="3f2a1b2c3d4e", sentence="0/1 workers can run job 3f2a1b", workers_total=1
    )
    w, _ = widget(make_job(1, pending=report))
    assert (w.job_id, w.name, w.state) == ("3f2a1b2c3d4e", "cell", "queued")
    assert w.pending == "0/1 workers can run job 3f2a1b"
    assert w.elapsed == -1.0 and not w.terminal


def test_running_gang_shows_placement_ranks_and_progress() -> None:
    placement = Placement(
        nodes=[NodePlacement(worker_id="w", worker_name="box", devices=[0, 1], simulated=True)]
    )
    job = make_job(
        2,
        state=JobState.RUNNING,
        placement=placement,
        started_at=1.0,
        progress={"step": 3, "total": 10, "loss": 0.25},
    )
    w, _ = widget(job)
    assert w.placement == "box GPUs 0,1 (simulated) · ranks 0-1"
    assert w.simulated and w.ranks == 2 and w.running
    assert w.progress == pytest.approx(0.3)
    assert w.progress_text == "step 3/10 (30%) · loss 0.25"
    assert w.pending == ""


def test_logs_are_appended_by_message_and_kept_at_the_end() -> None:
    w, sent = widget(make_job())
    w.feed(Update("logs", records=[LogRecord(seq=1, time=0.0, stream="stdout", rank=1, text="hi")]))
    assert sent == [{"type": "logs", "lines": [["stdout", 1, "hi"]]}]
    assert w.log_tail == []  # not resent on every line
    done = make_job(state=JobState.SUCCEEDED, started_at=1.0, finished_at=2.0)
    w.feed(Update("done", job=done))
    assert w.log_tail == [["stdout", 1, "hi"]]
    assert w.terminal and not w.blocking
    assert w.outcome == "job 3f2a1b2c3d4e (cell) succeeded in 1s"


def test_a_progress_bars_redraws_show_as_one_line() -> None:
    w, sent = widget(make_job())
    tqdm = "\r  5%|#    | 1/20\r 10%|##   | 2/20\r100%|#####| 20/20"
    w.add_logs([LogRecord(seq=1, time=0.0, stream="stderr", text=tqdm)])
    assert sent == [{"type": "logs", "lines": [["stderr", None, "100%|#####| 20/20"]]}]


def test_cancel_button_message_when_the_kernel_is_idle() -> None:
    bridge = FakeBridge()
    w, _ = widget(make_job(), bridge)
    w._on_msg(w, {"type": "cancel"}, [])
    assert bridge.cancelled == ["3f2a1b2c3d4e"]
    assert w.state == "cancelled" and "cancel requested" in w.message


def test_rest_cancel_is_tried_only_for_a_served_control_plane() -> None:
    served = FakeBridge(Target(url="http://127.0.0.1:40123"), embedded=False)
    assert rest_cancel_path(served, "abc") == "jobs/abc/cancel"  # under gpulayer/api/v1
    assert rest_cancel_path(FakeBridge(), "abc") == ""  # embedded: interrupt the kernel instead


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_widget_js_parses() -> None:
    js = Path(__file__).parents[2] / "gpulayer_kernel" / "jupyter" / "widget.js"
    subprocess.run(
        ["node", "--input-type=module", "--check"],
        input=js.read_bytes(),
        check=True,
        timeout=30,
    )


def test_a_retried_job_shows_its_cost_and_every_attempt() -> None:
    from gpulayer_kernel.contracts import AttemptRecord

    first = AttemptRecord(
        attempt=0,
        placed_at=1,
        started_at=2,
        ended_at=60,
        outcome="preempted",
        reason="preempted: worker fake-1c2d",
        retried=True,
        workers=["fake-1c2d"],
        provider="fake",
        units=2,
        unit_price=2.1,
        estimate=4.2,
        charge=0.07,
    )
    second = AttemptRecord(attempt=1, placed_at=70, workers=["fake-9a8b"], estimate=4.2)
    w, _ = widget(make_job(1, history=[first, second]))
    assert w.cost == "$0.07 + ≈ $4.20"
    assert w.attempts == [
        "attempt 0 on fake-1c2d (fake): preempted (preempted: worker fake-1c2d), $0.07 of "
        "≈ $4.20, retried",
        "attempt 1 on fake-9a8b: running, ≈ $4.20",
    ]
    single, _ = widget(make_job(1, history=[second]))
    assert single.cost == "≈ $4.20" and single.attempts == []
