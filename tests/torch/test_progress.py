"""Progress: real control messages over a FIFO inside a job, a text line outside one, MFU."""

from __future__ import annotations

import errno
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from gpulayer_kernel import job  # noqa: E402
from gpulayer_kernel.torch import Trainer, TrainerConfig, peak_flops  # noqa: E402
from gpulayer_kernel.torch.progress import ProgressDisplay, format_line  # noqa: E402
from gpulayer_kernel.torch.testing import TinyRegressor, regression_data  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture(autouse=True)
def _single_process(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GPULAYER_JOB_ID", "GPULAYER_CONTROL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPULAYER_OUTPUT", str(tmp_path / "output"))


@pytest.fixture
def control_fifo(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[int]:
    """A worker's end of the job control FIFO: the read fd, opened before the job writes."""
    path = tmp_path / "control"
    os.mkfifo(path)
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a writer can only open with a reader
    monkeypatch.setenv("GPULAYER_CONTROL", str(path))
    monkeypatch.setenv("GPULAYER_JOB_ID", "job-test")
    monkeypatch.setattr(job, "_fd", None)  # job.py caches its write fd per process
    monkeypatch.setattr(job, "_fd_failed", False)
    yield reader
    if job._fd is not None:
        os.close(job._fd)
    os.close(reader)


def read_messages(fd: int) -> list[dict[str, Any]]:
    data = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError as exc:
            if exc.errno == errno.EAGAIN:
                break
            raise
        if not chunk:
            break
        data += chunk
    return [json.loads(line) for line in data.decode().splitlines()]


def batches() -> list[Any]:
    data = regression_data(48)
    return [data[i : i + 8] for i in range(0, 48, 8)]


def test_progress_reaches_the_worker_inside_a_job(
    control_fifo: int, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    torch.manual_seed(0)
    result = Trainer(TrainerConfig(max_steps=6, log_every=2)).fit(TinyRegressor(), batches())
    messages = read_messages(control_fifo)
    assert [m["kind"] for m in messages] == ["progress"] * 3
    fields = [m["fields"] for m in messages]
    assert [f["step"] for f in fields] == [2, 4, 6]
    for f in fields:
        assert f["total"] == 6 and f["epoch"] in (0, 1) and f["mfu"] is None
        assert type(f["loss"]) is float and type(f["samples_per_s"]) is float
        assert f["samples_per_s"] > 0
    assert fields[-1]["loss"] == pytest.approx(result.metrics["loss"])
    assert capsys.readouterr().out == ""  # in a job the widget shows progress, not stdout
    assert result.checkpoint == tmp_path / "output" / "step-00000006.pt"  # an artifact


def test_only_rank_zero_reports(control_fifo: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")  # a rank of a job whose group is not up (world size 1)
    Trainer(TrainerConfig(max_steps=4, log_every=2)).fit(TinyRegressor(), batches())
    assert read_messages(control_fifo) == []


def test_outside_a_job_a_line_is_printed_every_log_every(
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = TrainerConfig(max_epochs=2, log_every=4, checkpoint_at_end=False)
    Trainer(config).fit(TinyRegressor(), batches())
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("  ")[0] for line in lines] == ["step 4/12", "step 8/12", "step 12/12"]
    assert all("samples/s" in line and "loss " in line for line in lines)


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_one_line_redrawn_in_place() -> None:
    terminal = FakeTerminal()
    display = ProgressDisplay(terminal)
    display.update({"step": 1, "total": 2, "epoch": 0, "loss": 0.5})
    display.update({"step": 2, "total": 2, "epoch": 0, "loss": float("nan")})
    display.close()
    out = terminal.getvalue()
    assert out.count("\r") == 2 and out.endswith("\n") and out.count("\n") == 1
    assert "loss 0.5" in out and "nan" not in out  # non-finite values are dropped, not shown


def test_format_line() -> None:
    line = format_line(
        {
            "step": 120,
            "total": 1000,
            "epoch": 1,
            "loss": 0.41234,
            "samples_per_s": 2345.6,
            "mfu": 0.412,
            "lr": 3e-4,
            "val_loss": 0.5,
            "mystery": None,
        }
    )
    assert line == (
        "step 120/1000  epoch 1  loss 0.4123  2,346 samples/s  mfu 41.2%  lr 3.00e-04  val_loss 0.5"
    )


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H200", 989e12),
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA L40S", 362e12),
        ("NVIDIA L4", 121e12),
        ("Tesla T4", None),
    ],
)
def test_peak_flops_table(monkeypatch: pytest.MonkeyPatch, name: str, peak: float | None) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert peak_flops(torch.device("cuda", 0)) == peak
    assert peak_flops(torch.device("cpu")) is None


def test_a_session_prints_progress_lines_and_reports_them_too(
    control_fifo: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 36: inside a session (or a GPU kernel) a fit printed nothing until it ended."""
    monkeypatch.setenv("GPULAYER_SESSION", "job-test")
    stream = io.StringIO()
    display = ProgressDisplay(stream)
    display.update({"step": 10, "total": 100, "epoch": 0, "loss": 0.5})
    assert stream.getvalue() == "step 10/100  epoch 0  loss 0.5\n"
    [message] = read_messages(control_fifo)
    assert message["kind"] == "progress" and message["fields"]["step"] == 10


def test_a_one_shot_job_leaves_its_progress_to_the_widget(control_fifo: int) -> None:
    stream = io.StringIO()
    ProgressDisplay(stream).update({"step": 1, "total": 2, "epoch": 0, "loss": 0.5})
    assert stream.getvalue() == "", "the widget draws the messages; lines would show twice"
    assert [m["fields"]["step"] for m in read_messages(control_fifo)] == [1]
