"""A session rank is IPython's own shell: state, Out[n], display, figures, tracebacks, interrupts.

The host process is driven here over its socket exactly as the worker's SessionExecutor drives
it (frames of JSON), without a worker around it.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulayer_kernel import transfer
from gpulayer_kernel.worker.sessions.wire import recv_frame, send_frame

ROOT = str(Path(__file__).resolve().parents[2])


class Host:
    def __init__(self, tmp: Path, prelude: str = "pass") -> None:
        ours, theirs = socket.socketpair()
        self.sock = ours
        self.tmp = tmp
        env = {**os.environ, "PYTHONPATH": ROOT, "GPULAYER_MAX_DISPLAY_BYTES": "200000"}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"import sys; {prelude}; from gpulayer_kernel.worker.sessions import "
                "host as h; sys.exit(h.main())",
            ],
            stdin=theirs.fileno(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        theirs.close()
        self.ready = recv_frame(self.sock)
        self.n = 0

    def send(self, code: str, **fields: Any) -> int:
        self.n += 1
        send_frame(self.sock, {"op": "run", "n": self.n, "code": code, "history": True, **fields})
        return self.n

    def done(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        outs = []
        while True:
            frame = recv_frame(self.sock)
            assert frame is not None, "the host exited"
            if "done" in frame:
                return frame, outs
            outs.append(frame)

    def run(self, code: str, **fields: Any) -> dict[str, Any]:
        self.send(code, **fields)
        return self.done()[0]

    def close(self) -> tuple[bytes, bytes]:
        send_frame(self.sock, {"op": "exit"})
        out, err = self.proc.communicate(timeout=10)
        self.sock.close()
        return out, err


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    h = Host(tmp_path)
    try:
        yield h
    finally:
        if h.proc.poll() is None:
            h.close()


def text(frame: dict[str, Any]) -> str | None:
    value = frame.get("value")
    return None if value is None else value["data"].get("text/plain")


def streams(frame: dict[str, Any], name: str) -> str:
    return "".join(p for k, p in frame["items"] if k == name)


def test_state_is_kept_and_the_last_value_is_shown_as_out(host: Host) -> None:
    assert host.ready is not None and host.ready["world_size"] == 1
    first = host.run("y = 5\nprint('set')\ny")
    assert first["status"] == "ok" and text(first) == "5" and streams(first, "stdout") == "set\n"
    assert text(host.run("y * 2")) == "10"
    assert host.run("y = 7;")["value"] is None  # a trailing ; shows nothing, as in Jupyter
    assert text(host.run("_")) == "10"  # IPython's own output history


def test_display_stderr_and_warnings_arrive_in_order(host: Host) -> None:
    done = host.run(
        "import sys, warnings\nfrom IPython.display import display, HTML\n"
        "print('a')\ndisplay(HTML('<b>b</b>'))\nprint('c', file=sys.stderr)\n"
        "warnings.warn('careful')\n"
    )
    kinds = [k for k, _ in done["items"]]
    assert kinds[:3] == ["stdout", "display", "stderr"]
    assert done["items"][1][1]["data"]["text/html"] == "<b>b</b>"
    assert "UserWarning: careful" in streams(done, "stderr")


def test_a_matplotlib_figure_comes_back_as_a_png(host: Host) -> None:
    pytest.importorskip("matplotlib")
    done = host.run("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('loss')")
    figures = [p for k, p in done["items"] if k == "display" and "image/png" in p["data"]]
    assert len(figures) == 1 and len(figures[0]["data"]["image/png"]) > 1000


def test_tracebacks_are_ipythons_and_point_into_the_cell(host: Host) -> None:
    done = host.run("# %%gpulayer\nx = 1\n1 / 0\n", count=7)
    assert done["status"] == "error"
    error = done["error"]
    assert error["ename"] == "ZeroDivisionError"
    shown = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(error["traceback"]))  # no colours
    assert "Cell In[7], line 3" in shown
    assert text(host.run("x")) == "1"  # the session survived


def test_an_interrupt_raises_in_the_cell_and_keeps_the_state(host: Host) -> None:
    host.run("kept = 'yes'")
    host.send("import time\nprint('go', flush=True)\nfor i in range(600):\n    time.sleep(0.05)\n")
    while True:  # the cell runs once its first line's output streams out
        frame = recv_frame(host.sock)
        assert frame is not None and "done" not in frame, frame
        if any(k == "stdout" and "go" in p for k, p in frame.get("items", [])):
            break
    os.killpg(host.proc.pid, signal.SIGINT)
    done, _ = host.done()
    assert done["status"] == "error" and done["error"]["ename"] == "KeyboardInterrupt"
    os.killpg(host.proc.pid, signal.SIGINT)  # between cells: nothing to stop, nothing breaks
    assert text(host.run("kept")) == "'yes'"


def test_a_long_cell_streams_its_output_before_it_ends(host: Host) -> None:
    host.send("import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.2)\n")
    done, outs = host.done()
    early = "".join(p for f in outs for k, p in f["items"] if k == "stdout")
    assert early.startswith("0\n") and streams(done, "stdout") + early == "0\n1\n2\n"


def test_inputs_and_outputs_travel_as_json_or_as_a_transfer_file(host: Host) -> None:
    torch = pytest.importorskip("torch")
    path = host.tmp / "in.safetensors"
    path.write_bytes(transfer.encode({"w": torch.ones(2, 2)}))
    out = host.tmp / "out.safetensors"
    done = host.run(
        "z = w * k",
        inputs={"k": 3},
        inputs_path=str(path),
        outputs=["z", "k"],
        outputs_path=str(out),
    )
    assert done["status"] == "ok" and done["outputs_path"] == str(out)
    back = transfer.decode(out.read_bytes())
    assert back["k"] == 3 and torch.equal(back["z"], torch.full((2, 2), 3.0))
    assert host.run("", outputs=["k"])["outputs"] == {"k": 3}


def test_a_cells_out_is_its_last_value_as_in_a_one_shot_cell_else_the_variable(
    host: Host,
) -> None:
    assert host.run("x = 1\nx + 1", outputs=["x"])["outputs"] == {"x": 2}
    assert host.run("y = 5", outputs=["y"])["outputs"] == {"y": 5}  # no value: the variable
    assert host.run("y = 6\ny;", outputs=["y"])["outputs"] == {"y": 6}  # hidden: the same
    missing = host.run("z = 1", outputs=["nope"])["outputs_error"]
    assert missing == "the cell has no value and the session has no variable nope"


def test_outputs_that_cannot_move_say_why(host: Host) -> None:
    host.run("f = lambda: 1")
    assert "no variable nope" in host.run("", outputs=["nope"])["outputs_error"]
    refused = host.run("", outputs=["f"], outputs_path=str(host.tmp / "o"))["outputs_error"]
    assert "code (a function" in refused


def test_a_display_past_the_limit_is_cut_with_a_note(host: Host) -> None:
    done = host.run("from IPython.display import display, HTML\ndisplay(HTML('x' * 300000))")
    shown = done["items"][0][1]["data"]
    assert "text/html" not in shown and "GPULAYER_MAX_DISPLAY_BYTES" in shown["text/plain"]


def test_fd_level_output_goes_to_the_process_pipes(host: Host) -> None:
    host.run("import os\nos.write(1, b'raw\\n')")
    out, _ = host.close()
    assert b"raw" in out


def test_a_worker_without_ipython_says_which_extra_to_install(tmp_path: Path) -> None:
    # sys.modules[name] = None makes `import IPython` raise ImportError, as when it is missing.
    h = Host(tmp_path, prelude="sys.modules['IPython'] = None")
    try:
        assert h.ready is not None and "fatal" in h.ready
        assert (
            "a session on this worker: the 'jupyter' extra of gpulayer is not installed"
            in (h.ready["fatal"])
        )
        assert "pip install 'gpulayer[jupyter]'" in h.ready["fatal"]
        assert h.proc.wait(timeout=10) == 1
    finally:
        h.sock.close()
        h.proc.stdout.close()  # type: ignore[union-attr]
        h.proc.stderr.close()  # type: ignore[union-attr]
