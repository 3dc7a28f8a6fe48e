"""The live chart in a real JupyterLab and Chromium: a Trainer in a ``%%gpulayer`` cell draws it.

The cell trains a real (tiny) model through the Trainer in a job; its progress reports (loss and
the ``self.log(prog_bar=True)`` metrics) become chart points while the job runs. The screenshot
goes to test-artifacts/screenshots/widget-live-chart.png; copy it to docs/images/ (docs/trainer.md
shows it) when the chart's look changes — a test run never rewrites a tracked file.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS

from .test_widget_browser import lab_with, run_first_two_cells

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.torch,
    pytest.mark.skipif(
        not Path(CHROMIUM).exists()
        or importlib.util.find_spec("playwright") is None
        or importlib.util.find_spec("jupyterlab") is None
        or importlib.util.find_spec("torch") is None,
        reason="needs chromium, playwright, jupyterlab and torch",
    ),
]

SCREENSHOT = (
    Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots" / "widget-live-chart.png"
)

TRAIN = """%%gpulayer --name train-mlp
import time
import torch
from gpulayer_kernel.torch import Trainer
from gpulayer_kernel.torch.testing import LoggingRegressor, regression_data

class Paced(LoggingRegressor):  # a real model, slowed so the chart grows while we watch
    def training_step(self, batch):
        time.sleep(0.03)
        return super().training_step(batch)

data = regression_data(512)
loader = [data[i : i + 16] for i in range(0, 512, 16)]
torch.manual_seed(0)
Trainer(max_steps=200, log_every=5, val_every=25, loggers=[]).fit(Paced(), loader, loader[:4])
"""


def cell(source: str) -> dict[str, object]:
    return {
        "cell_type": "code",
        "metadata": {},
        "outputs": [],
        "execution_count": None,
        "source": source,
    }


NOTEBOOK = {
    "cells": [cell("%load_ext gpulayer_kernel.jupyter\n%gpulayer status"), cell(TRAIN)],
    "metadata": {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
    },
    "nbformat": 4,
    "nbformat_minor": 5,
}


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[str]:
    with lab_with(tmp_path, NOTEBOOK) as url:
        yield url


def legend(page: object) -> list[str]:
    return page.eval_on_selector_all(  # type: ignore[attr-defined,no-any-return]
        ".gpulayer-job .gl-chart .u-legend .u-series .u-label", "els => els.map(e => e.textContent)"
    )


def test_a_training_cell_draws_a_live_chart(lab: str) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            run_first_two_cells(page, lab)
            # The chart appears while the job runs, with the loss and the prog_bar metrics.
            page.wait_for_selector(".gpulayer-job .gl-chart canvas", timeout=90_000)
            page.wait_for_function(
                "() => /step 1[0-9]{2}\\/200/.test("
                "document.querySelector('.gpulayer-job .gl-progress-text')?.textContent || '')",
                timeout=90_000,
            )
            assert page.inner_text(".gpulayer-job .gl-state") == "running"
            names = legend(page)
            assert names[0] == "step" and {"loss", "train_mae_step", "val_loss"} <= set(names)
            assert "rank" not in names  # logged without prog_bar: not in progress, not charted
            assert "samples_per_s" not in names and "lr" not in names  # bookkeeping
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            page.locator(".gpulayer-job").screenshot(path=str(SCREENSHOT))
            page.wait_for_function(
                "() => document.querySelector('.gpulayer-job .gl-state')?.textContent"
                " === 'succeeded'",
                timeout=90_000,
            )
            assert page.is_visible(".gpulayer-job .gl-chart canvas")  # stays after the end
        finally:
            browser.close()
