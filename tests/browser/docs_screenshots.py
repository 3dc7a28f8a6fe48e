"""Make the screenshots of docs/jupyterlab-panel.md (docs/images/panel-*.png).

    .venv/bin/python -m tests.browser.docs_screenshots [OUT_DIR]

Starts a JupyterLab with two simulated GPUs, keeps both busy with a two-rank "training" job that
reports progress, queues a job behind it, opens the log view, and saves the panel, the log view
and the dark theme. Not a test: run it by hand when the panel's look changes.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from playwright.sync_api import expect, sync_playwright

from .conftest import CHROMIUM, CHROMIUM_ARGS, Lab, open_lab, start_lab

TRAIN = """
import os, time
from gpulayer_kernel import job
rank = int(os.environ.get("RANK", "0"))
for step in range(1, 2001):
    loss = 2.5 / (1 + step / 40)
    if step % 25 == 0:
        print(f"step {step:4d}  loss {loss:.4f}  lr 3.0e-04", flush=True)
        if rank == 0:
            job.progress(step=step, total=2000, loss=round(loss, 4), samples_per_s=5120)
    time.sleep(0.01)
"""


def scene(lab: Lab) -> tuple[str, str]:
    train = lab.submit("train-gpt-small", [sys.executable, "-u", "-c", TRAIN], gpus=2)
    lab.call("GET", f"/jobs/{train['id']}/logs", since=0, wait=30)
    lab.submit("eval-checkpoint", ["sleep", "1"], gpus=1)
    done = lab.submit("prepare-data", [sys.executable, "-c", "print('ok')"])
    lab.call("GET", f"/jobs/{done['id']}/wait", timeout=30)
    return train["id"], done["id"]


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        lab = start_lab(Path(tmp))
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            train, _ = scene(lab)
            page = open_lab(browser, lab, "docs", width=1180, height=720)
            panel = page.locator("#gpulayer-panel")
            expect(panel.locator(".gl-Progress-text").first).to_contain_text("step", timeout=30_000)
            time.sleep(3)
            panel.screenshot(path=str(out / "panel-workers-queue.png"))
            panel.locator(f'li[data-job="{train}"] .gl-Row-name').click()
            log = page.locator(f'.gl-LogViewBody[data-job="{train}"] .gl-Log')
            expect(log).to_contain_text("step  200", timeout=30_000)
            time.sleep(1)
            page.screenshot(path=str(out / "panel-live-log.png"))
            page.evaluate(
                "() => window.jupyterapp.commands.execute("
                "'apputils:change-theme', { theme: 'JupyterLab Dark' })"
            )
            time.sleep(2)
            panel.screenshot(path=str(out / "panel-dark.png"))
            lab.call("POST", f"/jobs/{train}/cancel")
        finally:
            browser.close()
            lab.stop()


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs/images"))
