"""A session driven from a notebook in a real JupyterLab and Chromium (ADR 0019).

The control plane lives in the Jupyter server (the extension); the notebook's kernel talks to it
over its loopback listener, and the session's ranks run on the extension's local worker (two
simulated GPUs). State is kept across cells, a matplotlib figure appears in the cell, an
interrupt stops the running cell and keeps the state, and the panel shows the session with its
holder and idle clock, and stops it. Beside it, in the same Lab: a one-shot cell's Cancel button
(the cell widget, built with the panel's requester) cancels its job through the extension.
"""

from __future__ import annotations

import json
import shutil
from typing import Any

import pytest

from .conftest import CHROMIUM, PANEL_TAB, Lab, open_lab, shot

pytestmark = [pytest.mark.browser, pytest.mark.slow]

if not shutil.which(CHROMIUM):
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install -y chromium)", allow_module_level=True)
expect: Any = pytest.importorskip("playwright.sync_api").expect
SECOND = 1000

CELLS = [
    "%load_ext gpulayer_kernel\n%gpulayer session start --name browser --idle-timeout 20m",
    "%%gpulayer\ny = 41\nprint('set y on the worker')",
    "%%gpulayer\ny + 1",
    "%%gpulayer\nimport matplotlib.pyplot as plt\nplt.plot([3, 1, 2])\nplt.title('loss');",
    "%%gpulayer\nimport time\nprint('ticking', flush=True)\ntime.sleep(600)",
    "%%gpulayer\ny",
]


def notebook(cells: list[str] = CELLS) -> dict[str, Any]:
    return {
        "cells": [
            {
                "cell_type": "code",
                "metadata": {},
                "outputs": [],
                "execution_count": None,
                "source": source,
            }
            for source in cells
        ],
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def output(page: Any, index: int) -> Any:
    return page.locator(".jp-Notebook .jp-Cell").nth(index).locator(".jp-OutputArea")


def run_next(page: Any) -> None:
    page.keyboard.press("Shift+Enter")


def open_notebook(browser: Any, lab: Lab, name: str, cells: list[str]) -> Any:
    """Lab with the notebook ``name`` of ``cells`` open, its kernel idle, its first cell
    selected."""
    (lab.root / f"{name}.ipynb").write_text(json.dumps(notebook(cells)))
    page = open_lab(browser, lab, f"{name}-notebook", width=1400, height=900)
    # `.then(() => null)`: the command resolves to the document widget, which Playwright
    # cannot serialise ("object reference chain is too long") once the panel holds it.
    page.evaluate(
        f"window.jupyterapp.commands.execute('docmanager:open', {{path: '{name}.ipynb'}})"
        ".then(() => null)"
    )
    page.wait_for_function("() => document.body.innerText.includes('| Idle')", timeout=90 * SECOND)
    page.locator(".jp-Notebook .jp-Cell").nth(0).click()
    return page


def test_a_session_from_a_notebook_keeps_state_plots_survives_an_interrupt_and_stops(
    browser: Any, lab: Lab
) -> None:
    pytest.importorskip("matplotlib")
    page = open_notebook(browser, lab, "sessions", CELLS)
    try:
        run_next(page)
        expect(output(page, 0)).to_contain_text("session browser is up", timeout=120 * SECOND)
        run_next(page)
        expect(output(page, 1)).to_contain_text("set y on the worker", timeout=60 * SECOND)
        run_next(page)
        expect(output(page, 2)).to_contain_text("42", timeout=60 * SECOND)
        run_next(page)
        expect(output(page, 3).locator("img")).to_have_count(1, timeout=90 * SECOND)
        run_next(page)
        expect(output(page, 4)).to_contain_text("ticking", timeout=60 * SECOND)
        page.evaluate(
            "window.jupyterapp.commands.execute('notebook:interrupt-kernel').then(() => null)"
        )
        expect(output(page, 4)).to_contain_text("KeyboardInterrupt", timeout=60 * SECOND)
        # The cell's own end (its traceback names the line it stopped in), not only the note
        # that the interrupt was sent: a cell run before the error reply would be aborted by
        # ipykernel (stop_on_error), as in any notebook.
        expect(output(page, 4)).to_contain_text("time.sleep(600)", timeout=60 * SECOND)
        run_next(page)
        expect(output(page, 5)).to_contain_text("41", timeout=60 * SECOND)

        page.click(PANEL_TAB) if "lm-mod-current" not in (
            page.get_attribute(PANEL_TAB, "class") or ""
        ) else None
        row = page.locator('#gpulayer-panel li[data-session="browser"]')
        expect(row).to_contain_text("held by sessions.ipynb", timeout=30 * SECOND)
        expect(row).to_contain_text("ends in")
        expect(row.locator(".gl-Badge[data-state]")).to_have_text("idle")
        shot(page, "panel-session")
        row.get_by_role("button", name="Stop session browser").click()
        page.locator(".jp-Dialog .jp-mod-warn").click()
        expect(row).to_have_count(0, timeout=30 * SECOND)
    except BaseException:
        shot(page, "panel-session-FAILED")
        raise
    finally:
        page.context.close()


def test_a_one_shot_cells_cancel_button_cancels_through_the_extensions_route(
    browser: Any, lab: Lab
) -> None:
    """The control plane is the extension's, so the widget's Cancel button asks the Jupyter
    server's GPUlayer route (the panel's requester, the page's XSRF cookie) while the cell
    blocks: the job is cancelled and the cell ends with ``JobCancelled``, no interrupt."""
    sleepy = "%%gpulayer --name sleepy\nimport time\nprint('up', flush=True)\ntime.sleep(600)"
    page = open_notebook(browser, lab, "cancel", ["%load_ext gpulayer_kernel", sleepy])
    try:
        run_next(page)
        run_next(page)
        job = output(page, 1).locator(".gpulayer-job")
        expect(job.locator(".gl-logs")).to_contain_text("up", timeout=90 * SECOND)
        job.locator(".gl-cancel").click()
        expect(job.locator(".gl-state")).to_have_text("cancelled", timeout=60 * SECOND)
        # The route's way ends the cell with JobCancelled; the fallback (interrupting the
        # kernel) with KeyboardInterrupt. (The button's own note, "cancel requested", lasts
        # only until the job's next update replaces it: not something to wait for.)
        expect(output(page, 1)).to_contain_text("JobCancelled", timeout=60 * SECOND)
        assert "KeyboardInterrupt" not in output(page, 1).inner_text()
    except BaseException:
        shot(page, "widget-cancel-FAILED")
        raise
    finally:
        page.context.close()
