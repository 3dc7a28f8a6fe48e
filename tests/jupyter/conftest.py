"""Fixtures for the Jupyter integration: a real kernel with isolated state, and a shell.

``gl_kernel`` starts one ipykernel per test module (kernel starts are slow) with its own
``GPULAYER_HOME``, Jupyter and IPython folders in tmp, and no served control plane or notebook
session in its environment (so jobs show as text, as under nbval).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

CLEAR_ENV = (
    "GPULAYER_URL",
    "GPULAYER_TOKEN",
    "GPULAYER_SIMULATE_GPUS",
    "GPULAYER_DISPLAY",
    "JPY_SESSION_NAME",
)


def kernel_env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLEAR_ENV}
    for name, sub in (
        ("GPULAYER_HOME", "gpulayer-home"),
        ("JUPYTER_CONFIG_DIR", "jupyter-config"),
        ("JUPYTER_DATA_DIR", "jupyter-data"),
        ("JUPYTER_RUNTIME_DIR", "jupyter-runtime"),
        ("IPYTHONDIR", "ipython"),
    ):
        (root / sub).mkdir(parents=True, exist_ok=True)
        env[name] = str(root / sub)
    env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"  # debugpy's frozen-modules note on stderr
    return env


@dataclass
class Execution:
    reply: dict[str, Any]
    messages: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.reply["content"]["status"] == "ok")

    def stream(self, name: str | None = None) -> str:
        return "".join(
            m["content"]["text"]
            for m in self.messages
            if m["msg_type"] == "stream" and (name is None or m["content"]["name"] == name)
        )

    @property
    def error(self) -> dict[str, Any]:
        errors = [m["content"] for m in self.messages if m["msg_type"] == "error"]
        assert errors, f"no error message; reply: {self.reply['content']}"
        return errors[0]

    def result_text(self) -> str:
        for m in self.messages:
            if m["msg_type"] == "execute_result":
                return str(m["content"]["data"]["text/plain"])
        raise AssertionError("no execute_result")


class Kernel:
    """A started kernel and a blocking client; ``run(code)`` executes and collects iopub."""

    def __init__(self, km: Any, kc: Any) -> None:
        self.km = km
        self.kc = kc

    def run(
        self,
        code: str,
        timeout: float = 60.0,
        on_message: Callable[[dict[str, Any]], None] | None = None,
    ) -> Execution:
        msg_id = self.kc.execute(code, allow_stdin=False)
        deadline = time.monotonic() + timeout
        messages: list[dict[str, Any]] = []
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"cell did not finish in {timeout}s: {code[:80]!r}"
            msg = self.kc.get_iopub_msg(timeout=left)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            msg["received"] = time.monotonic()
            messages.append(msg)
            if on_message is not None:
                on_message(msg)
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        while True:
            reply = self.kc.get_shell_msg(timeout=max(1.0, deadline - time.monotonic()))
            if reply["parent_header"].get("msg_id") == msg_id:
                return Execution(reply, messages)


@contextlib.contextmanager
def started_kernel(root: Path, **extra_env: str) -> Iterator[Kernel]:
    """A real ipykernel in ``root`` with isolated state (``kernel_env``); shut down on exit."""
    from jupyter_client.manager import start_new_kernel

    env = {**kernel_env(root), **extra_env}
    old = os.environ.get("JUPYTER_RUNTIME_DIR")
    os.environ["JUPYTER_RUNTIME_DIR"] = env["JUPYTER_RUNTIME_DIR"]  # the connection file
    try:
        km, kc = start_new_kernel(kernel_name="python3", env=env, cwd=str(root))
    finally:
        if old is None:
            os.environ.pop("JUPYTER_RUNTIME_DIR", None)
        else:
            os.environ["JUPYTER_RUNTIME_DIR"] = old
    try:
        yield Kernel(km, kc)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
        km.cleanup_resources()


@pytest.fixture(scope="module")
def gl_kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    with started_kernel(tmp_path_factory.mktemp("kernel")) as kernel:
        loaded = kernel.run("%load_ext gpulayer_kernel.jupyter")
        assert loaded.ok, loaded.reply
        yield kernel
