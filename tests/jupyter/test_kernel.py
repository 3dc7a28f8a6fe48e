"""``%%gpulayer`` in a real ipykernel, driven by jupyter_client as a notebook frontend would.

One kernel for the module (``gl_kernel``), on its own embedded control plane: logs must arrive as
stream messages while the cell runs, results land in ``--out``, an interrupt cancels the job and
leaves no process behind, and in widget mode the widget and its log messages go over iopub.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

import pytest

from .conftest import Kernel

pytestmark = pytest.mark.slow


def test_logs_stream_while_the_cell_runs_and_out_gets_the_result(gl_kernel: Kernel) -> None:
    run = gl_kernel.run(
        "%%gpulayer --out x\n"
        "import time\n"
        "print('first', flush=True)\n"
        "time.sleep(1.5)\n"
        "print('second')\n"
        "1 + 1\n"
    )
    assert run.ok, run.reply["content"]
    streams = [m for m in run.messages if m["msg_type"] == "stream"]
    first = next(m for m in streams if "first" in m["content"]["text"])
    second = next(m for m in streams if "second" in m["content"]["text"])
    # 'first' reached the frontend while the job still slept, not with everything at the end.
    assert second["received"] - first["received"] > 1.0
    assert "succeeded" in run.stream("stdout")
    assert gl_kernel.run("x").result_text() == "2"


def test_interrupt_cancels_the_job_and_stops_its_process_group(gl_kernel: Kernel) -> None:
    seen: dict[str, Any] = {}

    def on_message(msg: dict[str, Any]) -> None:
        text = msg["content"].get("text", "") if msg["msg_type"] == "stream" else ""
        m = re.search(r"pgid (\d+)", text)
        if m and "pgid" not in seen:
            seen["pgid"] = int(m.group(1))
            gl_kernel.km.interrupt_kernel()

    run = gl_kernel.run(
        "%%gpulayer --name sleeper\n"
        "import os, subprocess, time\n"
        "child = subprocess.Popen(['sleep', '60'])  # a grandchild in the job's group\n"
        "print('pgid', os.getpgid(0), flush=True)\n"
        "time.sleep(60)\n",
        on_message=on_message,
    )
    assert not run.ok
    assert "KeyboardInterrupt" in run.error["traceback"][0]
    assert "cancelled" in run.error["traceback"][0]
    assert "interrupted: cancelling job" in run.stream()
    pgid = seen["pgid"]
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)  # the whole process group is gone, grandchild included
    shown = gl_kernel.run("%gpulayer jobs --state cancelled")
    assert "sleeper" in shown.stream()


def test_failed_job_is_an_error_with_a_clean_message(gl_kernel: Kernel) -> None:
    run = gl_kernel.run("%%gpulayer\nx = 1\n1 / 0\n")
    assert not run.ok
    assert run.error["ename"] == "JobFailed"
    assert len(run.error["traceback"]) == 2  # the message and the hint; no GPUlayer frames
    assert "exited with code 1" in run.error["traceback"][0]
    assert 'File "cell.py", line 3' in run.stream("stderr")


def test_unknown_option_is_a_usage_error(gl_kernel: Kernel) -> None:
    before = gl_kernel.run("%gpulayer status").stream()
    run = gl_kernel.run("%%gpulayer --bogus\n1\n")
    assert not run.ok and run.reply["content"]["ename"] == "UsageError"
    assert "unrecognized arguments: --bogus" in run.stream("stderr")
    assert gl_kernel.run("%gpulayer status").stream() == before  # no job was submitted


def test_widget_mode_sends_the_widget_and_its_logs(gl_kernel: Kernel) -> None:
    assert gl_kernel.run("%gpulayer display widget").ok
    try:
        run = gl_kernel.run("%%gpulayer --out w\nprint('to the widget')\n'w'\n")
    finally:
        gl_kernel.run("%gpulayer display auto")
    assert run.ok, run.reply["content"]
    kinds = [m["msg_type"] for m in run.messages]
    assert "comm_open" in kinds
    views = [m for m in run.messages if m["msg_type"] == "display_data"]
    assert views and "application/vnd.jupyter.widget-view+json" in views[0]["content"]["data"]
    custom = [
        m["content"]["data"]["content"]
        for m in run.messages
        if m["msg_type"] == "comm_msg" and m["content"]["data"].get("method") == "custom"
    ]
    lines = [line for c in custom if c.get("type") == "logs" for line in c["lines"]]
    assert ["stdout", None, "to the widget"] in lines
    updates = [
        m["content"]["data"]["state"]
        for m in run.messages
        if m["msg_type"] == "comm_msg" and m["content"]["data"].get("method") == "update"
    ]
    assert any(u.get("state") == "succeeded" for u in updates)
    assert not run.stream("stdout")  # the widget shows it; no text copy in the cell
    assert gl_kernel.run("w").result_text() == "'w'"


def test_no_wait_returns_a_handle(gl_kernel: Kernel) -> None:
    run = gl_kernel.run("%%gpulayer --no-wait --handle h\nprint('bg')\n21 * 2\n")
    assert run.ok
    assert "job " in run.result_text()  # the handle's repr
    deadline = time.monotonic() + 30
    result = gl_kernel.run("h.result()")
    assert result.result_text() == "42" and time.monotonic() < deadline
    assert "bg" in gl_kernel.run("h.logs()").result_text()
