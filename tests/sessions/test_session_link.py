"""A notebook notices when its session is no longer its own (issue 23, item 5): stopped or
taken over by someone else, the next cell clears the link and says so in one line, and plain
cells are one-shot jobs again; a session the notebook started before its kernel restarted is
offered for ``attach`` in one hint. A real kernel on a served control plane, a real worker."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from gpulayer_kernel.testing import ServeProcess, WorkerProcess
from tests.jupyter.conftest import started_kernel

pytestmark = pytest.mark.slow

OTHER = (
    "from gpulayer_kernel.contracts import SessionHolder\n"
    "from gpulayer_kernel.jupyter.bridge import get_bridge\n"
    "import time\n"
    "def stop(name):  # as someone else would: not through this notebook's command\n"
    "    get_bridge().call(lambda s: s.stop_session(name))\n"
    "    while get_bridge().call(lambda s: s.get_session(name)).status.value != 'ended':\n"
    "        time.sleep(0.05)\n"
)


def plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def test_a_lost_session_link_is_cleared_said_and_offered(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    env["GPULAYER_SESSION_PRELOAD"] = ""
    with ServeProcess(tmp_path / "home", env=env) as server:
        join = server.create_token("join", ttl=600)
        with WorkerProcess(server.url, join, name="w1", home=tmp_path / "w1", env=env):
            kenv = {**server.client_env(), "GPULAYER_SESSION_PRELOAD": ""}
            kenv["JPY_SESSION_NAME"] = "train.ipynb"  # as a Jupyter server names the notebook
            with started_kernel(tmp_path / "k", **kenv) as k:
                assert k.run("%load_ext gpulayer_kernel").ok
                assert k.run(OTHER).ok
                # Stopped by someone else (here: a call that is not the notebook's command).
                assert k.run("%gpulayer session start --name a1", timeout=120).ok
                assert k.run("%%gpulayer\nv = 1\nv").result_text() == "1"
                assert k.run("stop('a1')").ok
                lost = k.run("%%gpulayer\nv + 1")
                assert not lost.ok
                [line] = [plain(t) for t in lost.error["traceback"]]
                assert "session a1 has ended (cancelled" in line
                assert "link to it is cleared" in line and "one-shot jobs again" in line
                # Plain cells are one-shot jobs again (no session state: a fresh process).
                again = k.run("%%gpulayer\n'v' in dir(), 6 * 7", timeout=120)
                assert again.ok, again.error
                assert again.result_text() == "[False, 42]"  # a job's value comes back as JSON
                listed = k.run("%gpulayer session list").stream()
                assert "* " not in listed
                # Taken over by another client.
                assert k.run("%gpulayer session start --name a2", timeout=120).ok
                took = k.run(
                    "get_bridge().call(lambda s: s.attach_session('a2', SessionHolder("
                    "client='other-kernel', notebook='theirs.ipynb')))"
                )
                assert took.ok
                taken = k.run("%%gpulayer\n1")
                [line] = [plain(t) for t in taken.error["traceback"]]
                assert "session a2 was taken over by" in line and "theirs.ipynb" in line
                assert k.run("%%gpulayer\n2 + 2", timeout=120).result_text() == "4"
                # A one-shot option on a cell whose session has gone: said, then run as asked.
                assert k.run("%gpulayer session start --name a3", timeout=120).ok
                assert k.run("stop('a3')").ok
                named = k.run("%%gpulayer --name solo\n5 * 5", timeout=120)
                assert named.ok, named.error
                assert named.result_text() == "25"
                assert "session a3 has ended" in named.stream("stderr")
                assert "this cell runs in session" not in named.stream()
                # A kernel restart loses the link to the session it started: offered once.
                assert k.run("%gpulayer session start --name kept", timeout=120).ok
                k.km.restart_kernel(now=False)
                k.kc.wait_for_ready(timeout=60)
                assert k.run("%load_ext gpulayer_kernel").ok
                first = k.run("%%gpulayer\n3", timeout=120)
                assert first.ok and first.result_text() == "3"
                hint = first.stream("stderr")
                assert hint.count("\n") == 1, hint
                assert "session kept" in hint and "%gpulayer session attach kept" in hint
                second = k.run("%%gpulayer\n4", timeout=120)
                assert "attach" not in second.stream()
                assert "attached" in k.run("%gpulayer session attach kept").stream()
