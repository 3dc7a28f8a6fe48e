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

from gpulayer_kernel.testing import wait_until

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
        specs = (
            ("--gpus", "1", "--wait", "60"),
            ("--gpus", "2", "--wait", "8"),  # waits behind what holds the worker's 2 GPUs
            ("--gpus", "4", "--wait", "300"),  # the worker has 2: it fails at once
            # idles out after 8 s; its kind in the launcher card's name
            ("--gpus", "1", "--gpu-kind", "a100-80gb", "--idle-timeout", "8", "--name", "gl-idle"),
        )
        for args in specs:
            done = subprocess.run(
                [GPULAYER, "kernelspec", "install", *args, "--user"],
                env=lab.env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, done.stderr
        found = httpx.get(f"{lab.url}api/kernelspecs", headers=lab.headers, timeout=30).json()
        names = {"gpulayer-1gpu", "gpulayer-2gpu", "gpulayer-4gpu", "gl-idle"}
        assert names <= set(found["kernelspecs"]), found
        yield lab
    finally:
        # Kernels whose start failed (two of them) no longer stop the server's shutdown
        # (jupyter_client 8.10 kept them pending, and shutdown_all failed on a 404 for them).
        proc = lab.proc
        lab.stop(timeout=45)
        assert proc is not None and proc.returncode == 0, lab.log()[-3000:]
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
    # Something holds the worker's GPUs (the first test's kernel may hold one: a kernel outlives
    # its tab): a 2-GPU kernel waits, and waiting helps.
    blocker = gpu_lab.submit("blocker", ["sleep", "600"], gpus=1)
    page = open_lab(browser, gpu_lab, "gpu-kernel-waits", width=1400, height=900)
    try:
        card = page.locator('.jp-LauncherCard[data-category="Notebook"]', has_text="2 GPUs")
        expect(card).to_have_count(1, timeout=30 * SECOND)
        card.click()
        # The panel's notice, while JupyterLab itself says only "Starting".
        notice = page.get_by_text(re.compile(r"^Untitled\d*\.ipynb waits for GPUs: "))
        expect(notice).to_be_visible(timeout=30 * SECOND)
        expect(notice).to_contain_text("0/1 workers can run job")
        expect(notice).to_contain_text("waiting helps")
        page.wait_for_timeout(800)  # the toast slides in: let the screenshot show it
        shot(page, "gpu-kernel-waits")
        # A toast is cut at 140 characters: its button shows the whole sentence in the Queue.
        page.get_by_role("button", name="Show in GPUlayer").click()
        queued = page.locator('#gpulayer-panel [data-testid="pending-sentence"]')
        expect(queued.first).to_contain_text("position 1 in the queue")
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
        gpu_lab.call("POST", f"/jobs/{blocker['id']}/cancel")


def test_a_gpu_kernel_no_worker_can_ever_run_fails_at_once_and_its_reason_wraps(
    browser: Any, gpu_lab: Lab
) -> None:
    page = open_lab(browser, gpu_lab, "gpu-kernel-never", width=1000, height=800)
    try:
        card = page.locator('.jp-LauncherCard[data-category="Notebook"]', has_text="4 GPUs")
        expect(card).to_have_count(1, timeout=30 * SECOND)
        card.click()
        # At once (its --wait is 300 s), with the scheduler's sentence: waiting won't help.
        dialog = page.locator(".jp-Dialog")
        expect(dialog).to_contain_text(
            "no worker here can ever run this GPU kernel", timeout=30 * SECOND
        )
        expect(dialog).to_contain_text("need 4; waiting won't help")
        reason = dialog.locator("pre").first
        wraps = reason.evaluate(
            "e => getComputedStyle(e).whiteSpace === 'pre-wrap' && e.scrollWidth <= e.clientWidth"
        )
        assert wraps, "the dialog's reason runs past its right edge"
        shot(page, "gpu-kernel-never-fits")
    except BaseException:
        shot(page, "gpu-kernel-never-fits-FAILED")
        raise
    finally:
        page.context.close()


def test_an_idle_gpu_kernel_says_so_in_a_notice_and_its_restart_button_reconnects(
    browser: Any, gpu_lab: Lab
) -> None:
    """Issue 33, item 1: the idle end is final (no new session behind the user's back), the
    notebook says why, and "Restart kernel" gets a GPU again."""
    page = open_lab(browser, gpu_lab, "gpu-kernel-idle", width=1400, height=900)
    try:
        name = "Python 3 (GPUlayer · 1 A100-80GB GPU)"  # the kind in the card's name
        card = page.locator(f'.jp-LauncherCard[data-category="Notebook"][title="{name}"]')
        expect(card).to_have_count(1, timeout=30 * SECOND)
        card.click()
        page.wait_for_function(
            "() => document.body.innerText.includes('| Idle')", timeout=90 * SECOND
        )
        expect(run(page, 0, "x = 41\nprint('up')")).to_contain_text("up", timeout=60 * SECOND)
        kernels_before = _live_kernel_sessions(gpu_lab)
        # Idle for 8 s: the session ends, the notebook is told, and nothing starts again.
        notice = page.get_by_text(re.compile(r"GPU kernel: session ended: idle for"))
        expect(notice).to_be_visible(timeout=60 * SECOND)
        page.wait_for_timeout(800)
        shot(page, "gpu-kernel-idle-end")
        page.wait_for_timeout(6000)  # two rounds of jupyter_client's restarter
        assert _live_kernel_sessions(gpu_lab) == kernels_before - 1
        said = run(page, 1, "x")
        expect(said).to_contain_text(
            "this GPU kernel's session ended: idle for", timeout=30 * SECOND
        )
        expect(said).to_contain_text("Kernel ▸ Restart")
        # The notice's button restarts this notebook's kernel: a new session, a GPU again.
        page.get_by_role("button", name="Restart kernel").click()
        wait_until(lambda: _live_kernel_sessions(gpu_lab) == kernels_before, 60)
        page.wait_for_function(
            "() => !document.body.innerText.includes('| Restarting')"
            " && document.body.innerText.includes('| Idle')",
            timeout=90 * SECOND,
        )
        expect(run(page, 2, "print(1 + 1)")).to_contain_text("2", timeout=60 * SECOND)
    except BaseException:
        shot(page, "gpu-kernel-idle-FAILED")
        raise
    finally:
        page.context.close()


def _live_kernel_sessions(lab: Lab) -> int:
    return sum(1 for s in lab.call("GET", "/sessions")["sessions"] if s["kernel"])
