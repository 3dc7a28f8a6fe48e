"""Sessions in a real kernel, as a notebook uses them: ``%gpulayer session start``, then
``%%gpulayer`` cells that keep state and show their output as local cells do."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulayer_kernel.contracts import SessionStatus
from gpulayer_kernel.testing import ServeProcess, WorkerProcess, wait_until
from tests.jupyter.conftest import Kernel, kernel_env

pytestmark = pytest.mark.slow


def plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    """One kernel on its own embedded control plane, with a session ``nb`` started in it."""
    from jupyter_client.manager import start_new_kernel

    root = tmp_path_factory.mktemp("kernel")
    env = {**kernel_env(root), "GPULAYER_SESSION_PRELOAD": ""}
    km, kc = start_new_kernel(kernel_name="python3", env=env, cwd=str(root))
    k = Kernel(km, kc)
    try:
        assert k.run("%load_ext gpulayer_kernel").ok
        started = k.run("%gpulayer session start --name nb", timeout=120)
        assert started.ok, started.reply["content"]
        assert "session nb is up" in started.stream()
        yield k
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
        km.cleanup_resources()


def test_state_output_and_values_come_back_as_a_local_cells_would(kernel: Kernel) -> None:
    first = kernel.run("%%gpulayer\ny = 5\nprint('set y')\ny")
    assert first.ok and first.stream("stdout") == "set y\n" and first.result_text() == "5"
    second = kernel.run("%%gpulayer\nimport sys\nprint('to stderr', file=sys.stderr)\ny * 2")
    assert second.stream("stderr") == "to stderr\n" and second.result_text() == "10"
    shown = kernel.run(
        "%%gpulayer\nfrom IPython.display import HTML, display\ndisplay(HTML('<b>bold</b>'))"
    )
    [data] = [m["content"]["data"] for m in shown.messages if m["msg_type"] == "display_data"]
    assert data["text/html"] == "<b>bold</b>"
    assert kernel.run("%%gpulayer\ny;").messages and not any(
        m["msg_type"] == "execute_result" for m in kernel.run("%%gpulayer\ny;").messages
    )


def test_a_matplotlib_figure_appears_in_the_cell(kernel: Kernel) -> None:
    pytest.importorskip("matplotlib")
    run = kernel.run("%%gpulayer\nimport matplotlib.pyplot as plt\nplt.plot([3, 1, 2]);")
    images = [
        m
        for m in run.messages
        if m["msg_type"] == "display_data" and "image/png" in m["content"]["data"]
    ]
    assert run.ok and len(images) == 1


def test_a_failing_cell_shows_the_remote_traceback_with_the_cells_lines(kernel: Kernel) -> None:
    run = kernel.run("%%gpulayer\nz = 1\n1 / 0\n")
    assert not run.ok
    count = run.reply["content"]["execution_count"]
    shown = plain("\n".join(run.error["traceback"]))
    assert "ZeroDivisionError" in shown and f"Cell In[{count}], line 3" in shown
    assert kernel.run("%%gpulayer\nz").result_text() == "1"  # the session kept its state


def test_interrupting_the_kernel_interrupts_the_cell_and_keeps_the_state(kernel: Kernel) -> None:
    kernel.run("%%gpulayer\nkept = 'still here'")

    def on_message(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream" and "looping" in msg["content"]["text"]:
            kernel.km.interrupt_kernel()

    run = kernel.run(
        "%%gpulayer\nimport time\nprint('looping', flush=True)\nfor _ in range(1200):\n"
        "    time.sleep(0.05)\n",
        on_message=on_message,
    )
    assert not run.ok
    assert "KeyboardInterrupt" in plain("\n".join(run.error["traceback"]))
    assert "the session keeps its state" in run.stream("stderr")
    assert kernel.run("%%gpulayer\nkept").result_text() == "'still here'"


def test_a_second_interrupt_restarts_the_session(kernel: Kernel) -> None:
    kernel.run("%%gpulayer\nlost_soon = 1")
    interrupts: list[float] = []

    def on_message(msg: dict[str, Any]) -> None:
        text = msg["content"].get("text", "") if msg["msg_type"] == "stream" else ""
        if ("stubborn" in text and not interrupts) or ("interrupt again" in text):
            interrupts.append(time.monotonic())
            kernel.km.interrupt_kernel()

    run = kernel.run(
        "%%gpulayer\nimport time\nprint('stubborn', flush=True)\nwhile True:\n    try:\n"
        "        time.sleep(0.05)\n    except KeyboardInterrupt:\n        pass\n",
        on_message=on_message,
        timeout=90,
    )
    assert not run.ok and len(interrupts) == 2
    assert "was restarted" in run.error["traceback"][0]
    gone = kernel.run("%%gpulayer\nlost_soon")
    assert "NameError" in plain("\n".join(gone.error["traceback"]))


def test_fresh_runs_a_one_shot_job_beside_the_session(kernel: Kernel) -> None:
    kernel.run("%%gpulayer\nonly_in_session = 1")
    run = kernel.run("%%gpulayer --fresh\n'only_in_session' in dir()")
    assert run.ok and run.result_text() == "False"
    assert "succeeded" in run.stream()


def test_bad_options_and_unknown_sessions_are_clear_errors(kernel: Kernel) -> None:
    run = kernel.run("%%gpulayer --gpus 2\n1")
    assert "--gpus is for one-shot jobs" in run.error["traceback"][0]
    run = kernel.run("%%gpulayer --session nope\n1")
    assert "no session 'nope'" in run.error["traceback"][0] and "nb" in run.error["traceback"][0]
    run = kernel.run("%%gpulayer --session nb --fresh\n1")
    assert "contradict" in run.error["traceback"][0]


def test_push_and_pull_move_tensors_and_refuse_what_cannot_move(kernel: Kernel) -> None:
    pytest.importorskip("torch")
    pushed = kernel.run("import torch\nw = torch.arange(6.).reshape(2, 3)\n%gpulayer push w")
    assert pushed.ok and "pushed w" in pushed.stream() and "to session nb" in pushed.stream()
    kernel.run("%%gpulayer\nw2 = w * 2")
    pulled = kernel.run("%gpulayer pull w2")
    assert pulled.ok and "pulled w2" in pulled.stream()
    assert kernel.run("w2.tolist()").result_text() == "[[0.0, 2.0, 4.0], [6.0, 8.0, 10.0]]"
    refused = kernel.run("f = lambda x: x\n%gpulayer push f")
    assert "code (a function" in refused.error["traceback"][0]
    assert "define it in the session" in refused.error["traceback"][1]
    gen = kernel.run("g = (i for i in range(3))\n%gpulayer push g")
    assert "a generator" in gen.error["traceback"][0]
    fh = kernel.run(
        "fh = open(__file__ if '__file__' in dir() else '/etc/hostname')\n%gpulayer push fh"
    )
    assert "an open file" in fh.error["traceback"][0]


def test_in_and_out_carry_json_and_tensors(kernel: Kernel) -> None:
    pytest.importorskip("torch")
    kernel.run("import torch\nbase = torch.ones(3)\nscale = 2")
    run = kernel.run("%%gpulayer --in base,scale --out total\ntotal = (base * scale).sum()")
    assert run.ok, run.error if not run.ok else None
    assert kernel.run("float(total)").result_text() == "6.0"


def test_session_list_show_and_stop(kernel: Kernel) -> None:
    listed = kernel.run("%gpulayer session list").stream()
    assert "* nb [idle]" in listed
    shown = kernel.run("%gpulayer session show").stream()
    assert "nb [idle]" in shown and "] error" in shown and "KeyboardInterrupt\n" in shown


def test_stop_returns_once_the_sessions_job_has_ended(kernel: Kernel) -> None:
    # "its GPUs are free" must be true when it is printed: the next placement may need them.
    assert kernel.run("%gpulayer session start --name brief", timeout=120).ok
    stopped = kernel.run("%gpulayer session stop brief")
    assert stopped.ok and "session brief stopped: its GPUs are free" in stopped.stream()
    state = kernel.run(
        "from gpulayer_kernel.jupyter.bridge import get_bridge\n"
        "get_bridge().call(lambda s: s.get_session('brief')).status.value"
    )
    assert state.result_text() == "'ended'"
    # The kernel's current session is no longer the stopped one: cells need a session again.
    assert "* nb" not in kernel.run("%gpulayer session list").stream()
    assert kernel.run("%gpulayer session attach nb").ok


def test_a_kernel_restart_keeps_its_sessions_and_a_shutdown_stops_them(tmp_path: Path) -> None:
    """On a served control plane (the kernel is a client): restart leaves the session for the
    new kernel to attach; shutdown stops it, saying why."""
    from jupyter_client.manager import start_new_kernel

    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    env["GPULAYER_SESSION_PRELOAD"] = ""
    with ServeProcess(tmp_path / "home", env=env) as server:
        join = server.create_token("join", ttl=600)
        with WorkerProcess(server.url, join, name="w1", home=tmp_path / "w1", env=env):
            kenv = {**kernel_env(tmp_path / "k"), **server.client_env()}
            kenv["GPULAYER_SESSION_PRELOAD"] = ""
            km, kc = start_new_kernel(kernel_name="python3", env=kenv, cwd=str(tmp_path))
            k = Kernel(km, kc)
            try:
                assert k.run("%load_ext gpulayer_kernel").ok
                assert k.run("%gpulayer session start --name kept", timeout=120).ok
                assert k.run("%%gpulayer\nx = 'from before the restart'").ok
                km.restart_kernel(now=False)
                kc.wait_for_ready(timeout=60)
                assert k.run("%load_ext gpulayer_kernel").ok
                held = k.run("%%gpulayer --session kept\nx")
                assert "held by" in held.error["traceback"][0]
                assert "attach" in held.error["traceback"][1]
                assert "attached" in k.run("%gpulayer session attach kept").stream()
                assert k.run("%%gpulayer\nx").result_text() == "'from before the restart'"
                assert k.run("%gpulayer session start --name mine", timeout=120).ok
            finally:
                kc.stop_channels()
                km.shutdown_kernel(now=False)
                km.cleanup_resources()
            with server.client() as c:
                # "mine" was started by the kernel that shut down: stopped, saying why.
                wait_until(lambda: c.get_session("mine").status == SessionStatus.ENDED, 30)
                mine = c.get_session("mine")
                assert mine.job.state.value == "cancelled"
                assert "kernel shut down" in (mine.reason or "")
                # "kept" was attached, not started, by it: it runs on for its starter.
                assert c.get_session("kept").status == SessionStatus.IDLE
