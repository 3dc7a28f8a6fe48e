"""A GPU kernel picked in a real JupyterLab's launcher and driven from Chromium (ADR 0021).

The control plane is the one inside the Lab's server extension: the extension sets
``GPULAYER_URL``/``GPULAYER_TOKEN`` in the server's environment, so the provisioner (which runs in
the Jupyter server process) finds it as the magics do and talks to it over its loopback HTTP
listener (``HttpLink``), and the kernel's session is placed on the extension's local worker (two
simulated GPUs), where a real ipykernel runs and its messages are relayed. A served ``gpulayer
serve`` with a worker in another network namespace is not used: the panel shows the extension's
control plane only, and this test checks the kernel there.

The spec is installed with ``gpulayer kernelspec install --gpus 1 --user`` in the Lab's own
environment (its private Jupyter data dir). The notebook keeps state across cells, an interrupt
ends a long cell with ``KeyboardInterrupt``, a restart loses the state, and the sidebar lists the
kernel marked "kernel". A kernel no worker can take shows the queue's sentence in a notice while
it waits, and JupyterLab's start error after its ``--wait``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import CHROMIUM, PANEL_TAB, Lab, open_lab, shot, start_lab

pytestmark = [pytest.mark.browser, pytest.mark.slow]

if not shutil.which(CHROMIUM):
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install -y chromium)", allow_module_level=True)
expect: Any = pytest.importorskip("playwright.sync_api").expect
SECOND = 1000
SPEC = "Python 3 (GPUlayer · 1 GPU)"
GPULAYER = str(Path(sys.executable).with_name("gpulayer"))  # the console script the user runs


@pytest.fixture(scope="module")
def gpu_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """A Lab whose Jupyter data dir holds the 1-GPU kernel spec, installed by the CLI."""
    base = tmp_path_factory.mktemp("gpulab")
    lab = start_lab(base)
    try:
        for gpus, wait in (("1", "60"), ("4", "8")):  # the worker has 2: a 4-GPU kernel waits
            done = subprocess.run(
                [GPULAYER, "kernelspec", "install", "--gpus", gpus, "--user", "--wait", wait],
                env=lab.env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, done.stderr
        specs = httpx.get(f"{lab.url}api/kernelspecs", headers=lab.headers, timeout=30).json()
        assert {"gpulayer-1gpu", "gpulayer-4gpu"} <= set(specs["kernelspecs"]), specs
        yield lab
    finally:
        # A kernel whose start failed stays among jupyter_client's pending kernels (8.10), so
        # the server's shutdown_all fails on it and the server waits for its SIGKILL: not 30 s.
        lab.stop(timeout=10)
    # Jupyter stops the server extension (and its control plane) before it shuts its kernels
    # down: that shutdown must still end without an error from the provisioner. (jupyter_server
    # itself logs a 404 for a kernel whose start failed, as for any kernel: not ours.)
    for failure in lab.log().split("Exception in callback")[1:]:
        traceback = failure.split("\n[", 1)[0]
        assert "gpulayer_kernel" not in traceback, traceback


def cell(page: Any, index: int) -> Any:
    return page.locator(".jp-Notebook .jp-Cell").nth(index)


def run(page: Any, index: int, source: str) -> Any:
    """Type ``source`` into cell ``index`` (made by the previous run) and run it."""
    editor = cell(page, index).locator(".cm-content")
    editor.click()
    page.keyboard.insert_text(source)
    page.keyboard.press("Shift+Enter")
    return cell(page, index).locator(".jp-OutputArea")


def command(page: Any, name: str) -> None:
    """Run a Lab command without awaiting it: a restart's promise waits for its dialog."""
    page.evaluate(f"() => {{ window.jupyterapp.commands.execute('{name}'); }}")


def test_a_gpu_kernel_from_the_launcher_keeps_state_interrupts_restarts_and_is_in_the_sidebar(
    browser: Any, gpu_lab: Lab
) -> None:
    page = open_lab(browser, gpu_lab, "gpu-kernel", width=1400, height=900)
    try:
        card = page.locator('.jp-LauncherCard[data-category="Notebook"]', has_text="1 GPU")
        expect(card).to_have_count(1, timeout=30 * SECOND)
        expect(card).to_have_attribute("title", SPEC)
        card.click()
        # Placement, the worker's ipykernel and the relay: the kernel reports Idle when ready.
        page.wait_for_function(
            "() => document.body.innerText.includes('| Idle')", timeout=90 * SECOND
        )
        expect(page.locator(".jp-Toolbar-kernelName").first).to_contain_text("GPUlayer")
        # GPULAYER_SESSION is set by the worker for its ranks: the cell ran there, not locally.
        where = run(page, 0, "import os\nx = 41\nprint('session', os.environ['GPULAYER_SESSION'])")
        expect(where).to_contain_text("session ", timeout=60 * SECOND)
        expect(run(page, 1, "x + 1")).to_contain_text("42", timeout=60 * SECOND)

        long_cell = run(page, 2, "import time\nprint('ticking', flush=True)\ntime.sleep(600)")
        expect(long_cell).to_contain_text("ticking", timeout=60 * SECOND)
        command(page, "notebook:interrupt-kernel")
        expect(long_cell).to_contain_text("KeyboardInterrupt", timeout=60 * SECOND)
        # The cell's own traceback, not only the note that the interrupt was sent: a cell run
        # before its error reply would be aborted by ipykernel (stop_on_error).
        expect(long_cell).to_contain_text("time.sleep(600)", timeout=60 * SECOND)
        expect(run(page, 3, "x")).to_contain_text("41", timeout=60 * SECOND)  # state kept

        command(page, "notebook:restart-kernel")
        page.locator(".jp-Dialog .jp-mod-accept").click()
        # The same session (and GPUs), a new ipykernel on them.
        page.wait_for_function(
            "() => !document.body.innerText.includes('| Restarting')"
            " && document.body.innerText.includes('| Idle')",
            timeout=60 * SECOND,
        )
        gone = run(page, 4, "x")
        expect(gone).to_contain_text("NameError", timeout=60 * SECOND)

        if "lm-mod-current" not in (page.get_attribute(PANEL_TAB, "class") or ""):
            page.click(PANEL_TAB)
        row = page.locator('#gpulayer-panel li[data-kind="kernel"]')
        expect(row).to_have_count(1, timeout=30 * SECOND)
        expect(row.get_by_test_id("session-kind")).to_have_text("kernel")
        expect(row).to_contain_text("held by Untitled.ipynb")
        expect(row).to_contain_text("GPU kernel picked in the launcher")
        shot(page, "panel-gpu-kernel")
    except BaseException:
        shot(page, "panel-gpu-kernel-FAILED")
        raise
    finally:
        page.context.close()


def test_a_gpu_kernel_waiting_for_gpus_says_why_in_a_notice_then_fails_after_its_wait(
    browser: Any, gpu_lab: Lab
) -> None:
    page = open_lab(browser, gpu_lab, "gpu-kernel-waits", width=1400, height=900)
    try:
        card = page.locator('.jp-LauncherCard[data-category="Notebook"]', has_text="4 GPUs")
        expect(card).to_have_count(1, timeout=30 * SECOND)
        card.click()
        # The panel's notice, while JupyterLab itself says only "Starting".
        notice = page.get_by_text(re.compile(r"^Untitled\d*\.ipynb waits for GPUs: "))
        expect(notice).to_be_visible(timeout=30 * SECOND)
        expect(notice).to_contain_text("0/1 workers can run job")
        expect(notice).to_contain_text("need 4; waiting won't help")
        page.wait_for_timeout(800)  # the toast slides in: let the screenshot show it
        shot(page, "gpu-kernel-waits")
        # A toast is cut at 140 characters: its button shows the whole sentence in the Queue.
        page.get_by_role("button", name="Show in GPUlayer").click()
        queued = page.locator('#gpulayer-panel [data-testid="pending-sentence"]')
        expect(queued).to_contain_text("waiting won't help); position 1 in the queue")
        # After the spec's --wait (8 s) the start fails with the same sentence; the notice goes.
        dialog = page.locator(".jp-Dialog")
        expect(dialog).to_contain_text("no GPU for this kernel within 8s", timeout=60 * SECOND)
        expect(dialog).to_contain_text("0/1 workers can run job")
        expect(notice).to_have_count(0, timeout=30 * SECOND)
    except BaseException:
        shot(page, "gpu-kernel-waits-FAILED")
        raise
    finally:
        page.context.close()
