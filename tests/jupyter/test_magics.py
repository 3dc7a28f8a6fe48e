"""``%%gpulayer`` and ``%gpulayer`` in an in-process IPython shell, on a real control plane.

One shell and one embedded control plane (with its local worker) per module; every job runs for
real as a subprocess. Option parsing and bad input are checked here; the kernel-level behaviour
(live streaming over iopub, interrupts) is in ``test_kernel.py``.
"""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from gpulayer_kernel.contracts import Job, JobState
from gpulayer_kernel.jupyter import bridge as bridge_mod
from gpulayer_kernel.jupyter import magics, textview
from gpulayer_kernel.jupyter.handle import CellError, JobCancelled, JobFailed, JobHandle, NoResult
from gpulayer_kernel.testing import wait_until


@pytest.fixture(scope="module")
def ip(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InteractiveShell]:
    root = tmp_path_factory.mktemp("shell")
    mp = pytest.MonkeyPatch()
    mp.setenv("GPULAYER_HOME", str(root / "home"))
    mp.setenv("IPYTHONDIR", str(root / "ipython"))
    for var in (
        "GPULAYER_URL",
        "GPULAYER_TOKEN",
        "GPULAYER_SIMULATE_GPUS",
        "GPULAYER_DISPLAY",
        "JPY_SESSION_NAME",
    ):
        mp.delenv(var, raising=False)
    mp.chdir(root)
    shell = InteractiveShell.instance()
    try:
        shell.run_line_magic("load_ext", "gpulayer_kernel.jupyter")
        yield shell
    finally:
        bridge_mod.close_bridge()
        mp.undo()
        leftovers = [
            p
            for p in psutil.Process().children(recursive=True)
            if "gpulayer_kernel.job.runner" in " ".join(_cmdline(p))
        ]
        assert not leftovers, f"job processes left running: {leftovers}"


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def cell(ip: InteractiveShell, line: str, body: str) -> Any:
    return ip.run_cell_magic("gpulayer", line, body)


def job_count() -> int:
    return len(bridge_mod.get_bridge().jobs(limit=1000))


# -- options and bad input ---------------------------------------------------------------------


def test_unknown_option_prints_usage_and_submits_nothing(ip: InteractiveShell) -> None:
    before = job_count()
    with pytest.raises(UsageError) as err:
        cell(ip, "--gpuz 1", "1 + 1")
    text = str(err.value)
    assert "unrecognized arguments: --gpuz 1" in text
    assert "usage: %%gpulayer [-h] [--gpus N]" in text and "--help" in text
    assert job_count() == before


def test_help_documents_every_option_and_submits_nothing(
    ip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    before = job_count()
    assert cell(ip, "--help", "1 + 1") is None
    out = capsys.readouterr().out
    for option in (
        "--gpus",
        "--gpu-kind",
        "--fallback",
        "--nodes",
        "--timeout",
        "--retries",
        "--retry-on",
        "--label",
        "--env",
        "--secret",
        "--in",
        "--out",
        "--files",
        "--name",
        "--worker",
        "--no-wait",
        "--handle",
    ):
        assert option in out
    assert job_count() == before


def test_labels_and_retry_causes_reach_the_job(ip: InteractiveShell) -> None:
    handle = cell(ip, "--label project=vision --retries 2 --retry-on failed --no-wait", "1 + 1")
    job = bridge_mod.get_bridge().get(handle.job.id)
    assert job.spec.labels["project"] == "vision"
    assert (job.spec.retries, job.spec.retry_on) == (2, ["failed"])
    with pytest.raises(CellError, match="--label 'oops' is not KEY=VALUE"):
        cell(ip, "--label oops", "1")


@pytest.mark.slow  # ~5 s with two xdist workers on two cores
def test_tensors_travel_through_in_and_out_of_a_one_shot_cell_without_pickle(
    ip: InteractiveShell,
) -> None:
    # Issue 13 item 5: --in/--out carry tensors, arrays and dicts of them, tensor-safe.
    import numpy as np
    import torch

    ip.user_ns["weights"] = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    ip.user_ns["batch"] = {"x": np.ones((2, 2), dtype=np.float32), "n": 2}
    ip.user_ns.pop("doubled", None)
    cell(
        ip,
        "--in weights,batch --out doubled",
        "import torch\n"
        "assert weights.dtype == torch.bfloat16 and batch['n'] == 2\n"
        "{'w': weights * 2, 'x': batch['x'] + 1}\n",
    )
    doubled = ip.user_ns["doubled"]
    assert torch.equal(doubled["w"], ip.user_ns["weights"] * 2)
    assert doubled["w"].dtype == torch.bfloat16
    assert isinstance(doubled["x"], np.ndarray) and (doubled["x"] == 2).all()


def test_an_in_value_that_cannot_travel_is_refused_before_anything_runs(
    ip: InteractiveShell,
) -> None:
    ip.user_ns["gen"] = (i for i in range(3))
    before = job_count()
    with pytest.raises(CellError) as err:
        cell(ip, "--in gen", "list(gen)")
    assert err.value.code == "not_transferable"
    assert "--in gen is a generator, which cannot move to a job" in err.value.message
    assert "GPUlayer never pickles" in err.value.message
    assert "list(gen)" in (err.value.hint or "")
    assert job_count() == before
    # Shown as one clean message, not a traceback through GPUlayer's code.
    assert err.value._render_traceback_()[0].endswith(err.value.message)


def test_unknown_in_variable_and_bad_names(ip: InteractiveShell) -> None:
    with pytest.raises(CellError, match="there is no variable 'nope' in the kernel"):
        cell(ip, "--in nope", "1")
    with pytest.raises(CellError, match="not a valid Python variable name"):
        cell(ip, "--out 1x", "1")
    with pytest.raises(CellError, match="--out needs the cell to wait"):
        cell(ip, "--out x --no-wait", "1")


def test_missing_files_path_is_named(ip: InteractiveShell) -> None:
    before = job_count()
    with pytest.raises(CellError) as err:
        cell(ip, "--files data/missing.csv", "1")
    assert "'data/missing.csv' does not exist" in err.value.message
    assert job_count() == before


def test_syntax_error_is_reported_before_submitting(ip: InteractiveShell) -> None:
    before = job_count()
    with pytest.raises(CellError, match="line 3 of the cell"):
        cell(ip, "", "x = 1\ndef broken(:\n")
    assert job_count() == before


def test_invalid_resource_names_the_option(ip: InteractiveShell) -> None:
    with pytest.raises(CellError, match="--gpus"):
        cell(ip, "--gpus -1", "1")
    with pytest.raises(CellError, match="--env '=X' is not KEY=VALUE"):
        cell(ip, "--env =X", "1")


def test_env_name_alone_passes_the_kernels_value_and_an_unset_one_is_named(
    ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GL_FROM_KERNEL", "kernel value")
    monkeypatch.setenv("GL_NOT_SENT", "hidden")
    body = "import os\n(os.environ.get('GL_FROM_KERNEL'), os.environ.get('GL_NOT_SENT'))"
    cell(ip, "--env GL_FROM_KERNEL --out seen", body)
    assert ip.user_ns["seen"] == ["kernel value", None]
    monkeypatch.delenv("GL_FROM_KERNEL")
    before = job_count()
    with pytest.raises(CellError, match="--env GL_FROM_KERNEL: GL_FROM_KERNEL is not set") as err:
        cell(ip, "--env GL_FROM_KERNEL", "1")
    assert "--env GL_FROM_KERNEL=VALUE" in (err.value.hint or "")
    assert job_count() == before


def test_a_function_in_value_gets_a_hint_about_defining_it_where_it_runs(
    ip: InteractiveShell,
) -> None:
    ip.user_ns["square"] = lambda x: x * x
    with pytest.raises(CellError) as err:
        cell(ip, "--in square", "square(3)")
    assert "torch tensors, numpy arrays" in err.value.message
    hint = err.value.hint or ""
    assert "define it in the cell" in hint and "--files" in hint


def test_cells_carry_the_notebook_label_when_the_kernel_knows_its_notebook(
    ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    cell(ip, "--name unlabelled", "1")
    assert magics.last_job().job.spec.labels == {}  # type: ignore[union-attr]
    monkeypatch.setenv("JPY_SESSION_NAME", "/home/me/work/train.ipynb")
    cell(ip, "--name labelled", "1")
    labels = magics.last_job().job.spec.labels  # type: ignore[union-attr]
    assert labels == {"gpulayer.io/notebook": "/home/me/work/train.ipynb"}
    monkeypatch.delenv("JPY_SESSION_NAME")
    monkeypatch.setitem(ip.user_ns, "__session__", "notebooks/other.ipynb")
    cell(ip, "--name from-session", "1")
    labels = magics.last_job().job.spec.labels  # type: ignore[union-attr]
    assert labels == {"gpulayer.io/notebook": "notebooks/other.ipynb"}


# -- running cells ---------------------------------------------------------------------------


def test_in_values_are_bound_and_out_gets_the_result(
    ip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    ip.user_ns.update(a=[1, 2, 3], b=(4, 5))
    cell(ip, "--in a,b --out total --name summing", "print('adding', a, b)\nsum(a) + sum(b)\n")
    assert ip.user_ns["total"] == 15
    out = capsys.readouterr().out
    assert "adding [1, 2, 3] [4, 5]" in out  # the tuple travelled as JSON: a list
    assert "(summing) succeeded" in out
    assert magics.last_job() is not None and magics.last_job().name == "summing"


def test_job_result_call_sets_the_result(ip: InteractiveShell) -> None:
    cell(ip, "--out r", "from gpulayer_kernel import job\njob.result({'ok': True})\nx = 1\n")
    assert ip.user_ns["r"] == {"ok": True}


def test_out_without_a_value_assigns_nothing(ip: InteractiveShell) -> None:
    ip.user_ns.pop("nothing", None)
    with pytest.raises(NoResult, match="--out nothing: the cell produced no value"):
        cell(ip, "--out nothing", "x = 1\n")
    assert "nothing" not in ip.user_ns


def test_a_cells_last_value_is_shown_like_a_local_cells(
    ip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 12 item 10: without --out the value is shown (Out[n]), not dropped; a value JSON
    # cannot carry is shown by its text form and does not fail the work done before it.
    assert cell(ip, "", "{'a': [1, 2]}\n") == {"a": [1, 2]}
    shown = cell(
        ip, "", "class Model:\n    def __repr__(self): return 'Model(3 layers)'\nModel()\n"
    )
    assert repr(shown) == "Model(3 layers)"
    ip.user_ns.pop("kept", None)
    shown = cell(ip, "--out kept", "{1, 2}\n")
    assert repr(shown) == "{1, 2}" and "kept" not in ip.user_ns
    err = capsys.readouterr().err
    # (the job succeeded: a failed job raises JobFailed from the magic)
    assert (
        "--out kept: the cell's last value is a builtins.set object, which cannot move from a "
        "job to the kernel" in err
    )


def test_a_fresh_cells_value_shows_through_the_same_mime_path_as_a_session_cells(
    ip: InteractiveShell,
) -> None:
    # Issue 13 item 7: a one-shot cell's value JSON cannot carry comes back as the MIME bundle
    # the worker made of it (its _repr_html_, _repr_png_…), not only its text form.
    code = (
        "class Table:\n"
        "    def _repr_html_(self): return '<table><tr><td>7</td></tr></table>'\n"
        "    def _repr_png_(self): return b'\\x89PNG fake'\n"
        "    def __repr__(self): return 'Table(1x1)'\n"
        "Table()\n"
    )
    shown = cell(ip, "--fresh", code)
    data, _ = shown._repr_mimebundle_()
    assert data["text/html"] == "<table><tr><td>7</td></tr></table>"
    assert base64.b64decode(data["image/png"]) == b"\x89PNG fake"
    assert data["text/plain"] == "Table(1x1)" and repr(shown) == "Table(1x1)"
    # IPython's own formatter takes it as it would a local value.
    formatted, _ = ip.display_formatter.format(shown)
    assert formatted["text/html"].startswith("<table>")


def test_failure_shows_the_traceback_with_cell_line_numbers(
    ip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    ip.user_ns.pop("never", None)
    with pytest.raises(JobFailed, match="exited with code 1"):
        cell(ip, "--out never", "x = 1\nraise ValueError('boom')\n")
    err = capsys.readouterr().err
    # Line 3 of the notebook cell: line 1 is the %%gpulayer line.
    assert 'File "cell.py", line 3, in <module>' in err
    assert "ValueError: boom" in err
    assert "runner.py" not in err  # GPUlayer's own frames are filtered out
    assert "never" not in ip.user_ns


def test_unchanged_cell_reuses_its_bundle(
    ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    session = bridge_mod.get_bridge().ready()
    uploads: list[str] = []
    real = session.blobs.upload  # where every bundle is stored, however it came

    async def counting(data: bytes, digest: str | None = None, **kw: Any) -> Any:
        uploads.append(digest or "")  # (a small bundle rides with its run: stored there)
        return await real(data, digest, **kw)

    monkeypatch.setattr(session.blobs, "upload", counting)
    (tmp_path / "helper.py").write_text("def twice(x):\n    return 2 * x\n")
    body = f"# reuse test {time.time()}\nfrom helper import twice\ntwice(21)\n"
    line = f"--files {tmp_path / 'helper.py'} --out v"
    cell(ip, line, body)
    cell(ip, line, body)
    assert ip.user_ns["v"] == 42
    assert len(uploads) == 1  # the second run found the digest and uploaded nothing
    cell(ip, line, body + "\n")  # a changed cell is a new bundle
    assert len(uploads) == 2


def test_no_wait_handle_pending_reason_and_cancel(ip: InteractiveShell) -> None:
    handle = cell(ip, "--gpus 1 --wait --no-wait --handle waiting", "print('never runs here')")
    assert isinstance(handle, JobHandle) and ip.user_ns["waiting"] is handle
    wait_until(lambda: handle.job.pending is not None, 10, what="the scheduler's reason")
    job = handle.job
    assert job.state == JobState.QUEUED and job.pending is not None
    assert "no GPUs" in job.pending.sentence and not job.pending.waiting_helps
    assert "no GPUs" in handle.explain()
    assert "waiting:" in repr_text(ip, handle)
    final = handle.cancel()
    assert final.state == JobState.CANCELLED
    with pytest.raises(JobCancelled):
        handle.result()


def repr_text(ip: InteractiveShell, obj: object) -> str:
    assert ip.display_formatter is not None
    data, _ = ip.display_formatter.format(obj)
    return str(data["text/plain"])


def test_blocking_gpu_cell_says_why_it_waits_until_cancelled(
    ip: InteractiveShell, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bridge = bridge_mod.get_bridge()
    said: list[str] = []  # the id of the job once the cell has printed why it waits
    real_update = textview.TextView.update

    def update(view: textview.TextView, job: Job) -> None:
        real_update(view, job)
        if job.state == JobState.QUEUED and job.pending is not None:
            said.append(job.id)

    monkeypatch.setattr(textview.TextView, "update", update)

    def cancel_when_waiting() -> None:
        try:
            wait_until(lambda: said, 20, what="the cell to say why it waits")
        finally:  # cancel even on a timeout, so the blocked cell ends and the test fails cleanly
            for j in bridge.jobs([JobState.QUEUED]):
                if j.spec.name == "wants-a-gpu":
                    bridge.cancel(j.id)

    t = threading.Thread(target=cancel_when_waiting)
    t.start()
    try:
        with pytest.raises(JobCancelled):
            cell(ip, "--gpus 1 --wait --name wants-a-gpu", "1")  # never fits: --wait
    finally:
        t.join()
    out = capsys.readouterr().out
    assert "waiting: 0/1 workers can run job" in out and "no GPUs" in out
    assert "waiting won't help" in out


def test_fallback_cpu_runs_on_the_cpu(
    ip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    cell(ip, "--gpus 1 --fallback cpu --out where", "import os\nos.environ['CUDA_VISIBLE_DEVICES']")
    assert ip.user_ns["where"] == ""
    assert "on CPU (fallback)" in capsys.readouterr().out


def test_env_progress_and_artifacts(
    ip: InteractiveShell, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    body = (
        "import os\n"
        "from gpulayer_kernel import job\n"
        "job.progress(step=5, total=10, loss=0.5)\n"
        "(job.output_dir() / 'report.txt').write_text(os.environ['GREETING'])\n"
        "'done'\n"
    )
    cell(ip, "--env GREETING=hi --handle made --out status", body)
    assert ip.user_ns["status"] == "done"
    handle: JobHandle = ip.user_ns["made"]
    assert [a.name for a in handle.artifacts] == ["report.txt"]
    assert handle.read_artifact("report.txt") == b"hi"
    saved = handle.download("report.txt", tmp_path)
    assert saved.read_text() == "hi"
    assert "progress: step 5/10 (50%) · loss 0.5" in capsys.readouterr().out
    assert "artifact: report.txt (2 B)" in repr_text(ip, handle.job)  # Job's own repr


# -- %gpulayer ---------------------------------------------------------------------------------


def test_line_commands(ip: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    cell(ip, "--name listed", "print('line one')")
    job_id = magics.last_job().id  # type: ignore[union-attr]
    capsys.readouterr()
    ip.run_line_magic("gpulayer", "status")
    out = capsys.readouterr().out
    assert "embedded control plane" in out and "workers: 1, GPUs: 0" in out
    assert "display: text" in out
    ip.run_line_magic("gpulayer", "workers")
    assert "no GPUs" in capsys.readouterr().out
    ip.run_line_magic("gpulayer", "jobs --limit 5")
    assert job_id in capsys.readouterr().out
    ip.run_line_magic("gpulayer", f"logs {job_id[:6]}")
    assert "line one" in capsys.readouterr().out
    ip.run_line_magic("gpulayer", f"explain {job_id}")
    assert "placed on local-" in capsys.readouterr().out
    ip.run_line_magic("gpulayer", f"show {job_id}")
    assert "placement: local-" in capsys.readouterr().out
    with pytest.raises(UsageError, match="unknown command 'frobnicate'"):
        ip.run_line_magic("gpulayer", "frobnicate")
    with pytest.raises(UsageError):
        ip.run_line_magic("gpulayer", "logs")  # JOB is required
    with pytest.raises(CellError, match="no job 'ffffffff'"):
        ip.run_line_magic("gpulayer", "logs ffffffff")


def test_cancel_command(ip: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    handle = cell(ip, "--no-wait", "import time\nprint('sleeping', flush=True)\ntime.sleep(60)")
    wait_until(lambda: handle.state == JobState.RUNNING, 20, what="the job to run")
    ip.run_line_magic("gpulayer", f"cancel {handle.id}")
    assert f"job {handle.id} (cell) cancelled" in capsys.readouterr().out
    assert handle.state == JobState.CANCELLED


def test_display_modes(ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch) -> None:
    assert magics.display_mode() == "text"  # not a kernel: nothing renders widgets
    monkeypatch.setenv("GPULAYER_DISPLAY", "widget")
    assert magics.display_mode() == "text"  # even when asked: there is no frontend


def test_connect_refuses_an_unreachable_server_then_local_again(
    ip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(CellError, match="cannot reach the control plane"):
        ip.run_line_magic("gpulayer", "connect http://127.0.0.1:9 --token t")
    ip.run_line_magic("gpulayer", "local")
    assert "using the embedded control plane" in capsys.readouterr().out
    cell(ip, "--out back", "'back'")
    assert ip.user_ns["back"] == "back"


def test_follow_a_no_wait_job_later(
    ip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    handle = cell(ip, "--no-wait --name later", "print('from the background')\n7 * 6")
    assert "(later)" in repr_text(ip, handle)
    final = handle.follow()
    assert final.state == JobState.SUCCEEDED and handle.result() == 42
    out = capsys.readouterr().out
    assert "from the background" in out and "(later) succeeded" in out
    assert "from the background" in str(handle.logs())
    ip.run_line_magic("gpulayer", "")  # no command: status
    assert "jobs:" in capsys.readouterr().out
