"""The notebook's folder where its GPU kernel runs, in a real JupyterLab driven from Chromium
(ADR 0022): a notebook in ``proj/`` on a worker that does not see the disk (``gpulayer worker
--host-id``, joined to the Lab's own control plane; the kernel spec asks for its GPU kind). The
kernel reads ``data.csv``, imports ``helpers.py``, sees ``helpers.py`` saved through Lab's
contents API at the next cell, and the ``results.csv`` it writes appears in Lab's file browser.
The sidebar marks the kernel "synced"."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpulayer_kernel.testing import WorkerProcess

from .conftest import CHROMIUM, PANEL_TAB, Lab, open_lab, shot, start_lab

pytestmark = [pytest.mark.browser, pytest.mark.slow]

if not shutil.which(CHROMIUM):
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install -y chromium)", allow_module_level=True)
expect: Any = pytest.importorskip("playwright.sync_api").expect
SECOND = 1000
GPULAYER = str(Path(sys.executable).with_name("gpulayer"))
NOTEBOOK = {
    "cells": [
        {"cell_type": "code", "metadata": {}, "source": "", "outputs": [], "execution_count": None}
    ],
    "metadata": {
        "kernelspec": {"name": "gpulayer-far", "display_name": "GPUlayer far", "language": "python"}
    },
    "nbformat": 4,
    "nbformat_minor": 5,
}


@pytest.fixture(scope="module")
def far_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Lab, Path]]:
    base = tmp_path_factory.mktemp("wslab")
    lab = start_lab(base)
    worker = None
    try:
        done = subprocess.run(
            [
                GPULAYER,
                "kernelspec",
                "install",
                "--gpus",
                "1",
                "--gpu-kind",
                "h100",
                "--name",
                "gpulayer-far",
                "--user",
                "--wait",
                "90",
            ],
            env=lab.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        join = lab.call("POST", "/tokens", {"kind": "join", "name": "far"})["secret"]
        worker = WorkerProcess(
            f"{lab.url}gpulayer/api/v1",
            join,
            name="far",
            simulate_gpus=1,
            simulate_kind="h100",
            home=base / "far",
            args=("--host-id", "another-machine"),
            env={**lab.env, "GPULAYER_SESSION_PRELOAD": ""},
        ).start()
        proj = lab.root / "proj"
        proj.mkdir()
        (proj / "data.csv").write_text("a,b\n1,2\n3,4\n")
        (proj / "helpers.py").write_text("VALUE = 1\n")
        (proj / "analysis.ipynb").write_text(json.dumps(NOTEBOOK))
        yield lab, proj
    finally:
        if worker is not None:
            worker.stop()
        lab.stop(timeout=10)


def cell(page: Any, index: int) -> Any:
    return page.locator(".jp-Notebook .jp-Cell").nth(index)


def run(page: Any, index: int, source: str) -> Any:
    editor = cell(page, index).locator(".cm-content")
    editor.click()
    page.keyboard.insert_text(source)
    page.keyboard.press("Shift+Enter")
    return cell(page, index).locator(".jp-OutputArea")


def command(page: Any, name: str, args: dict[str, Any]) -> None:
    page.evaluate(f"() => {{ window.jupyterapp.commands.execute('{name}', {json.dumps(args)}); }}")


def test_a_synced_kernel_reads_imports_sees_an_edit_and_its_output_reaches_the_file_browser(
    browser: Any, far_lab: tuple[Lab, Path]
) -> None:
    lab, proj = far_lab
    page = open_lab(browser, lab, "workspace", width=1400, height=900)
    try:
        command(page, "filebrowser:go-to-path", {"path": "proj/"})
        command(page, "docmanager:open", {"path": "proj/analysis.ipynb"})
        page.wait_for_function(
            "() => document.body.innerText.includes('| Idle')", timeout=120 * SECOND
        )
        out = run(page, 0, "import os\nprint(open('data.csv').read().count(','), os.getcwd())")
        expect(out).to_contain_text("3 ", timeout=90 * SECOND)
        expect(out).to_contain_text("/far/work/sessions/")  # a synced copy on that worker
        expect(run(page, 1, "import helpers\nprint(helpers.VALUE)")).to_contain_text(
            "1", timeout=60 * SECOND
        )
        # Saved as Lab saves a file: its contents API.
        saved = httpx.put(
            f"{lab.url}api/contents/proj/helpers.py",
            json={"type": "file", "format": "text", "content": "VALUE = 2\n"},
            headers=lab.headers,
            timeout=30,
        )
        assert saved.status_code == 200, saved.text
        reload = "import importlib\nimportlib.reload(helpers)\nprint('value', helpers.VALUE)"
        expect(run(page, 2, reload)).to_contain_text("value 2", timeout=60 * SECOND)
        run(page, 3, "open('results.csv', 'w').write('x,y\\n1,2\\n')")
        listed = page.locator(".jp-DirListing-itemName", has_text="results.csv")
        expect(listed).to_be_visible(timeout=60 * SECOND)
        assert (proj / "results.csv").read_text() == "x,y\n1,2\n"

        if "lm-mod-current" not in (page.get_attribute(PANEL_TAB, "class") or ""):
            page.click(PANEL_TAB)
        row = page.locator('#gpulayer-panel li[data-kind="kernel"]')
        expect(row.get_by_test_id("session-workspace")).to_have_text("synced", timeout=30 * SECOND)
        shot(page, "workspace-synced")
    except BaseException:
        shot(page, "workspace-synced-FAILED")
        raise
    finally:
        page.context.close()
