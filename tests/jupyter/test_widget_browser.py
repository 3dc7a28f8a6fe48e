"""The job widget in a real JupyterLab and Chromium: it renders, streams logs, and Cancel works.

The control plane is embedded in the kernel here (the server extension is switched off), so the
Cancel button must interrupt the kernel through the Jupyter server: the cell then ends with
``KeyboardInterrupt`` and the job is cancelled.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulayer_kernel.testing import wait_until

from .conftest import kernel_env

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(
        not Path(CHROMIUM).exists()
        or importlib.util.find_spec("playwright") is None
        or importlib.util.find_spec("jupyterlab") is None,
        reason="needs chromium, playwright and jupyterlab",
    ),
]

NOTEBOOK = {
    "cells": [
        {
            "cell_type": "code",
            "metadata": {},
            "outputs": [],
            "execution_count": None,
            "source": "%load_ext gpulayer_kernel.jupyter\n%gpulayer status",
        },
        {
            "cell_type": "code",
            "metadata": {},
            "outputs": [],
            "execution_count": None,
            "source": "%%gpulayer --name sleepy\nimport time\nfor i in range(200):\n"
            "    print('line', i, flush=True)\n    time.sleep(0.2)\n",
        },
    ],
    "metadata": {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
    },
    "nbformat": 4,
    "nbformat_minor": 5,
}


@contextlib.contextmanager
def lab_with(tmp_path: Path, notebook: dict[str, Any]) -> Iterator[str]:
    """A JupyterLab serving ``notebook`` as t.ipynb; yields the page's URL."""
    import json

    env = kernel_env(tmp_path)
    settings = Path(env["JUPYTER_CONFIG_DIR"]) / "lab" / "user-settings" / "@jupyterlab"
    (settings / "apputils-extension").mkdir(parents=True)
    (settings / "apputils-extension" / "notification.jupyterlab-settings").write_text(
        '{"fetchNews": "false", "checkForUpdates": false}'
    )
    root = tmp_path / "notebooks"
    root.mkdir()
    (root / "t.ipynb").write_text(json.dumps(notebook))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter",
            "lab",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            "--IdentityProvider.token=t0k",
            f"--ServerApp.root_dir={root}",
            "--allow-root",
            "--FileContentsManager.delete_to_trash=False",
            "--ServerApp.jpserver_extensions=gpulayer_kernel.jupyter=False",
        ],
        env={**env, "PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def listening() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
        except OSError:
            return False
        return True

    try:
        wait_until(listening, 60, what="jupyter lab to start")
        yield f"http://127.0.0.1:{port}/lab/tree/t.ipynb?token=t0k"
    finally:
        server.terminate()  # the server shuts its kernel down, which stops its jobs
        server.wait(30)


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[str]:
    with lab_with(tmp_path, NOTEBOOK) as url:
        yield url


def run_first_two_cells(page: Any, url: str) -> None:
    """Open the notebook, run its first cell (``%load_ext``), then start its second."""
    page.goto(url)
    page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=60_000)
    page.wait_for_function("() => document.body.innerText.includes('| Idle')", timeout=60_000)
    page.click(".jp-Notebook .jp-Cell >> nth=0")
    page.keyboard.press("Shift+Enter")
    page.wait_for_function(
        "() => document.body.innerText.includes('display: widget')", timeout=60_000
    )
    page.keyboard.press("Shift+Enter")


def test_widget_streams_logs_and_cancel_interrupts_the_kernel(lab: str) -> None:
    from playwright.sync_api import sync_playwright

    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        try:
            page = browser.new_page()
            run_first_two_cells(page, lab)
            page.wait_for_function(
                "() => document.querySelector('.gpulayer-job .gl-logs')?.textContent"
                ".includes('line 3')",
                timeout=60_000,
            )
            widget = page.inner_text(".gpulayer-job")
            assert "running" in widget and "sleepy" in widget and "(CPU)" in widget
            page.click(".gpulayer-job .gl-cancel")
            page.wait_for_function(
                "() => document.querySelector('.gpulayer-job .gl-state')?.textContent"
                " === 'cancelled'",
                timeout=60_000,
            )
            page.wait_for_function(
                "() => document.body.innerText.includes('KeyboardInterrupt: job')",
                timeout=30_000,
            )
        finally:
            browser.close()
