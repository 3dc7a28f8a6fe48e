"""Plain-text rendering: the same facts the widget shows, as lines."""

from __future__ import annotations

import io
import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest

from gpulayer_kernel import render
from gpulayer_kernel.artifacts import find_artifact
from gpulayer_kernel.contracts import (
    Artifact,
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
from gpulayer_kernel.errors import NotFound
from gpulayer_kernel.jupyter import textview

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
    assert render.state_line(done) == "job 3f2a1b2c3d4e (cell) failed in 1s: exited with code 1"
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


# One duration format (issue 34): the panel's, the widget's and this one share these examples.
DURATIONS = Path(__file__).parents[1] / "labextension" / "test" / "durations.json"
EXAMPLES = json.loads(DURATIONS.read_text())["examples"]


@pytest.mark.parametrize(("seconds", "text"), EXAMPLES)
def test_duration(seconds: float | None, text: str) -> None:
    assert render.duration(math.nan if seconds is None else seconds) == text


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_widget_writes_durations_as_python_does() -> None:
    widget = Path(__file__).parents[1] / "gpulayer_kernel" / "jupyter" / "widget.js"
    script = (
        f"import {{ formatDuration }} from {json.dumps(widget.as_uri())};\n"
        f"const examples = {json.dumps(EXAMPLES)};\n"
        "const words = examples.map(([s]) => formatDuration(s === null ? NaN : s));\n"
        "console.log(JSON.stringify(words));\n"
    )
    out = subprocess.run(
        ["node", "--input-type=module"],
        input=script.encode(),
        capture_output=True,
        check=True,
        timeout=30,
    ).stdout
    assert json.loads(out) == [text for _, text in EXAMPLES]


def test_text_view_streams_logs_in_order_with_rank_prefixes() -> None:
    out, err = io.StringIO(), io.StringIO()
    view = textview.TextView(out, err)
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
        "gpulayer: job 3f2a1b2c3d4e (cell) succeeded in 1s",
    ]
    assert err.getvalue() == "[rank 1] oops\n"


def test_text_view_says_why_a_job_waits_once() -> None:
    out = io.StringIO()
    view = textview.TextView(out, io.StringIO())
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


def test_progress_numbers_read_like_a_person_wrote_them() -> None:
    fields = {
        "step": 120,
        "total": 1000,
        "epoch": 1,
        "loss": 0.41234,
        "samples_per_s": 41230.4,
        "mfu": None,
        "lr": 3e-4,
    }
    assert render.progress(fields) == (
        "step 120/1,000 (12%) · epoch 1 · loss 0.4123 · 41,230 samples/s · lr 3.00e-04"
    )
    assert render.progress({"mfu": 0.412, "tokens": 1234567}) == "mfu 41.2% · tokens 1,234,567"


def test_progress_leaves_out_validation_figures_that_did_not_change() -> None:
    first = {"step": 500, "loss": 2.1, "val_loss": 2.303}
    later = {"step": 550, "loss": 2.0, "val_loss": 2.303}
    assert "val_loss 2.303" in render.progress(first)
    assert render.progress(later, previous=first) == "step 550 · loss 2"
    newer = {"step": 1000, "loss": 1.9, "val_loss": 2.1}
    assert "val_loss 2.1" in render.progress(newer, previous=later)


def test_text_view_does_not_repeat_a_stale_val_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(render, "PROGRESS_EVERY", 0.0)
    out = io.StringIO()
    view = textview.TextView(out, io.StringIO())
    for step, loss in ((500, 2.1), (550, 2.0), (600, 1.9)):
        view.update(
            make_job(
                state=JobState.RUNNING, progress={"step": step, "loss": loss, "val_loss": 2.303}
            )
        )
    progress_lines = [line for line in out.getvalue().splitlines() if "progress:" in line]
    assert len(progress_lines) == 3
    assert sum("val_loss" in line for line in progress_lines) == 1


def test_carriage_return_progress_shows_as_its_last_redraw() -> None:
    assert render.visible("\r 1/20\r 2/20\r 3/20") == " 3/20"
    assert render.visible("downloading\r") == "downloading"
    assert render.visible("plain") == "plain"
    record = LogRecord(seq=1, time=1.0, stream="stderr", rank=0, text="1/20\r2/20\r3/20")
    assert render.log_text(record) == "[rank 0] 3/20"
    out, err = io.StringIO(), io.StringIO()
    textview.TextView(out, err).add_logs([record])
    assert err.getvalue() == "[rank 0] 3/20\n"


def test_artifacts_table_and_finding_one_by_name() -> None:
    arts = [
        Artifact(digest="a" * 64, size=1536, name="rank0/step-00000300.pt", rank=0),
        Artifact(digest="b" * 64, size=12, name="report.txt"),
    ]
    job = make_job(state=JobState.SUCCEEDED, artifacts=arts)
    table = render.artifacts_table(job).splitlines()
    assert table[0].split() == ["NAME", "SIZE", "DIGEST"]
    assert table[1].split() == ["rank0/step-00000300.pt", "1.5", "KiB", "a" * 12]
    assert table[2].split() == ["report.txt", "12", "B", "b" * 12]
    assert find_artifact(job, "report.txt").digest == "b" * 64
    assert find_artifact(job, "step-00000300.pt").name == "rank0/step-00000300.pt"
    with pytest.raises(NotFound) as err:
        find_artifact(job, "missing.pt")
    assert "no artifact 'missing.pt'" in err.value.message
    assert "report.txt" in err.value.message and err.value.code == "artifact_not_found"
    assert "has no artifacts" in render.artifacts_table(make_job())


# -- small wrongs found from outside (issue 23, item 6) ----------------------------------------


def test_the_waiting_line_says_whether_waiting_helps_once() -> None:
    out = io.StringIO()
    view = textview.TextView(out, io.StringIO())
    report = PlacementReport(
        job_id="3f2a1b2c3d4e",
        sentence="0/1 workers can run job 3f2a1b: 1 has too few free GPUs (need 2; waiting helps)",
        exhausted=[ReasonCount(code=Reason.GPUS_BUSY, workers=1, detail="x", waiting_helps=True)],
        workers_total=1,
    )
    view.update(make_job(2, pending=report))
    [line] = [x for x in out.getvalue().splitlines() if x.startswith("gpulayer: waiting:")]
    assert line.count("waiting helps") == 1, line
    assert line.endswith("(cancel with %gpulayer cancel 3f2a1b2c3d4e or interrupt the kernel)")


def test_a_reason_the_log_said_is_not_said_again_and_marks_are_plain() -> None:
    out = io.StringIO()
    view = textview.TextView(out, io.StringIO())
    why = "job 3f2a1b2c can never run on the workers here: see `gpulayer workers`"
    view.add_logs([LogRecord(seq=1, time=1.0, stream="system", text=why)])
    job = make_job(64)
    view.update(job)
    failed = job.model_copy(update={"state": JobState.FAILED, "reason": why})
    assert view.said_why(failed)
    view.finish(failed)
    text = out.getvalue()
    assert text.count("can never run") == 1, text
    assert "`" not in text and "see gpulayer workers" in text
    assert text.splitlines()[-1] == "gpulayer: job 3f2a1b2c3d4e (cell) failed"
    # Said nowhere else: the closing line says it.
    other = textview.TextView(io.StringIO(), io.StringIO())
    assert not other.said_why(failed)
    assert render.state_line(failed).endswith(f"failed: {why}")


def test_counts_agree_with_their_nouns_and_sizes_read_in_binary_units() -> None:
    from gpulayer_kernel.contracts import SessionHolder, SessionInfo, SessionStatus

    def line(ranks: int, cells: int) -> str:
        info = SessionInfo(
            id="3f2a1b2c3d4e",
            name="s",
            status=SessionStatus.BUSY,
            job=make_job(1),
            holder=SessionHolder(client="k"),
            ranks=ranks,
            cells=cells,
            idle_timeout=60,
        )
        return render.session_line(info)

    assert ", 1 rank, 1 cell, " in line(1, 1)
    assert ", 2 ranks, 0 cells, " in line(2, 0)
    assert [render.size(n) for n in (512, 1536, 8 << 20, 1 << 30)] == [
        "512 B",
        "1.5 KiB",
        "8 MiB",
        "1 GiB",
    ]
    art = Artifact(name="out.bin", digest="a" * 64, size=3 << 20)
    described = render.summary(make_job(0, state=JobState.SUCCEEDED, artifacts=[art]))
    assert "out.bin (3 MiB)" in described and "bytes" not in described


def test_a_user_reads_another_user_s_device_as_busy() -> None:
    from gpulayer_kernel.contracts import Device, WorkerCapabilities, WorkerInfo
    from gpulayer_kernel.contracts.workers import HIDDEN_JOB

    caps = WorkerCapabilities(
        devices=[Device(index=i, vendor="sim", name="A100", kind="a100") for i in range(3)]
    )
    w = WorkerInfo(
        id="w",
        name="w",
        registered_at=0.0,
        last_heartbeat=0.0,
        capabilities=caps,
        device_jobs={0: "3f2a1b2c3d4e", 1: HIDDEN_JOB},
    )
    table = render.workers_table([w], now=0.0)
    assert "gpu 0: a100 ? [simulated]  job 3f2a1b2c3d4e" in table
    assert "gpu 1: a100 ? [simulated]  busy (another user's job)" in table
    assert "gpu 2: a100 ? [simulated]  free" in table
