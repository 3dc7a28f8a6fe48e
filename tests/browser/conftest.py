"""Browser fixtures: a real ``jupyter lab`` with GPUlayer, Debian's Chromium driven by Playwright.

``lab`` (one per module) runs JupyterLab with the extension, two simulated GPUs on the local
worker, news and update toasts off, and the app exposed as ``window.jupyterapp`` so tests can run
commands. ``page`` opens Lab with the GPUlayer panel shown and saves a screenshot to
``test-artifacts/screenshots/<test>.png`` when the test ends, passed or failed.

Needs ``/usr/bin/chromium`` (``apt-get install -y chromium``) and the Python ``playwright``
package; never ``playwright install`` (it downloads a browser, which fails here).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.jupyter_server.jupyter import JupyterProcess, isolated_env, lab_settings

CHROMIUM = os.environ.get("GPULAYER_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
ENABLE = "--ServerApp.jpserver_extensions=gpulayer_kernel.jupyter=True"
PANEL_TAB = '.jp-SideBar.jp-mod-left li[data-id="gpulayer-panel"]'


def require_browser() -> Any:
    """Skip (the calling test module) without Chromium or Playwright; else Playwright's sync API."""
    if not shutil.which(CHROMIUM):
        message = f"no Chromium at {CHROMIUM} (apt-get install -y chromium)"
        if os.environ.get("CI"):  # CI installs it (install.sh --dev): missing is a failure there
            pytest.fail(message)
        pytest.skip(message)
    return pytest.importorskip("playwright.sync_api")


class Lab(JupyterProcess):
    """A JupyterLab process plus a small API client for the tests."""

    def call(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        r = httpx.request(
            method, f"{self.api}{path}", json=body, params=params, headers=self.headers, timeout=90
        )
        assert r.status_code < 300, (method, path, r.status_code, r.text)
        return r.json() if r.content else None

    def submit(self, name: str, argv: list[str], gpus: int = 0) -> dict[str, Any]:
        spec = {
            "name": name,
            "workload": {"kind": "command", "argv": argv},
            "resources": {"gpus": gpus},
        }
        job: dict[str, Any] = self.call("POST", "/jobs", spec)
        return job


def start_lab(base: Path, *, port: int | None = None, token: str | None = None) -> Lab:
    env = isolated_env(base, GPULAYER_SIMULATE_GPUS="2")
    lab_settings(base / "settings")
    lab = Lab(
        base,
        app="lab",
        env=env,
        port=port,
        token=token,
        args=[ENABLE, "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None"],
        name=f"lab-{port or 'first'}",
    )
    return lab.start(timeout=90)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    jl = start_lab(tmp_path_factory.mktemp("lab"))
    try:
        yield jl
    finally:
        jl.stop()  # a test may have restarted it: this stops whichever process runs now


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with require_browser().sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


def open_lab(
    browser: Any, lab: Lab, workspace: str, *, width: int = 1280, height: int = 800
) -> Any:
    """Lab in a fresh workspace (tabs left open by another test are not restored here)."""
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    page.goto(f"{lab.url}lab/workspaces/{workspace}?reset&token={lab.token}")
    page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=60_000)
    page.wait_for_selector(PANEL_TAB, timeout=30_000)
    if "lm-mod-current" not in (page.get_attribute(PANEL_TAB, "class") or ""):
        page.click(PANEL_TAB)
    page.wait_for_selector("#gpulayer-panel .gl-PanelBody", timeout=30_000)
    return page


@pytest.fixture
def page(browser: Any, lab: Lab, request: pytest.FixtureRequest) -> Iterator[Any]:
    """Lab with the panel open. A test calls ``shot(page)`` at the moment worth keeping;
    otherwise (and on failure, as ``-FAILED``) the screenshot is taken when it ends."""
    name = re.sub(r"[^\w-]", "_", request.node.name)
    pg = open_lab(browser, lab, name[:60])
    try:
        yield pg
    finally:
        failed = getattr(request.node, "rep_call", None)
        if failed is not None and failed.failed:
            shot(pg, f"{name}-FAILED")
        elif name not in _TAKEN:
            shot(pg, name)
        pg.context.close()


_TAKEN: set[str] = set()


def shot(page: Any, name: str | None = None) -> Path:
    """Save a screenshot under test-artifacts/screenshots (named after the running test)."""
    if name is None:
        current = os.environ.get("PYTEST_CURRENT_TEST", "test").split("::")[-1].split(" ")[0]
        name = re.sub(r"[^\w-]", "_", current)
        _TAKEN.add(name)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    with contextlib.suppress(Exception):
        page.screenshot(path=str(path))
    return path
