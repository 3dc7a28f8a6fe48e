"""A GPU kernel in a real JupyterLab pointed at a served control plane, its worker in another
network namespace (issue 33, items 4 and "Also"), driven from Chromium:

    root namespace                                            netns B
    gpulayer serve (HTTPS, private CA) on 10.215.0.1  <─veth─>  gpulayer worker wb (2 sim GPUs)
    JupyterLab with GPULAYER_URL/GPULAYER_TOKEN                  its ipykernel
    Chromium

The panel works there (its routes forwarded to the served plane, no "unreachable" banner), a kernel
that waits for GPUs says why in the notice, and a ``kill -9`` of ``gpulayer serve`` under a
running cell is said in the cell; once the server is started again, the cell's output resumes and
the kernel keeps its state.

The addresses exist only on the veth pair this test creates (one end in the root namespace, one
in B); deleting B deletes both. Needs root and ``ip``; skipped with the reason otherwise.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpulayer_kernel.testing import ServeProcess, WorkerProcess
from gpulayer_kernel.testing import processes as spawning

from ..jupyter_server.jupyter import isolated_env, lab_settings
from .conftest import CHROMIUM, ENABLE, PANEL_TAB, Lab, open_lab, shot

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.netns, pytest.mark.timeout(420)]

if not shutil.which(CHROMIUM):
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install -y chromium)", allow_module_level=True)
expect: Any = pytest.importorskip("playwright.sync_api").expect
trustme: Any = pytest.importorskip("trustme")
SECOND = 1000
SERVER, WORKER = "10.215.0.1", "10.215.0.2"  # a private test range, on our veth pair only
GPULAYER = str(Path(sys.executable).with_name("gpulayer"))


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


@pytest.fixture(scope="module")
def namespace() -> Iterator[str]:
    """Network namespace B, joined to the root namespace by a veth pair; deleted afterwards."""
    if sys.platform != "linux" or os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs Linux, root and `ip` (iproute2) to make a network namespace")
    tag = f"{os.getpid() % 100000}"
    ns, here, there = f"gl-kb-{tag}", f"glkr{tag}", f"glkb{tag}"
    r = _ip("netns", "add", ns)
    if r.returncode != 0:
        pytest.skip(f"cannot create a network namespace here: {r.stderr.strip()}")
    try:
        steps = [
            ("link", "add", here, "type", "veth", "peer", "name", there, "netns", ns),
            ("addr", "add", f"{SERVER}/30", "dev", here),
            ("-n", ns, "addr", "add", f"{WORKER}/30", "dev", there),
            ("link", "set", here, "up"),
            ("-n", ns, "link", "set", there, "up"),
            ("-n", ns, "link", "set", "lo", "up"),
        ]
        for step in steps:
            r = _ip(*step)
            if r.returncode != 0:
                pytest.skip(f"cannot set up the veth pair (ip {' '.join(step)}): {r.stderr}")
        yield ns
    finally:
        _ip("netns", "del", ns)  # and with it the veth pair, both ends
        _ip("link", "del", here)  # in case B went first and left it (an error otherwise)


@dataclass
class ServedLab:
    server: ServeProcess
    worker: WorkerProcess
    lab: Lab
    ca: Path

    def call(self, method: str, path: str, **kw: Any) -> Any:
        """The served plane's API, as its admin (from the root namespace)."""
        headers = {"Authorization": f"Bearer {self.server.admin_token}"}
        r = httpx.request(
            method,
            f"{self.server.url}/api/v1{path}",
            headers=headers,
            verify=ssl.create_default_context(cafile=str(self.ca)),
            timeout=60,
            **kw,
        )
        assert r.status_code < 300, (method, path, r.status_code, r.text)
        return r.json() if r.content else None


@pytest.fixture(scope="module")
def served_lab(namespace: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedLab]:
    base = tmp_path_factory.mktemp("served-lab")
    ca = trustme.CA()
    cert = ca.issue_cert(SERVER)
    ca_pem, cert_pem, key_pem = (base / n for n in ("ca.pem", "cert.pem", "key.pem"))
    ca.cert_pem.write_to_path(str(ca_pem))
    cert.cert_chain_pems[0].write_to_path(str(cert_pem))
    cert.private_key_pem.write_to_path(str(key_pem))
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    clean["GPULAYER_SESSION_PRELOAD"] = ""
    tls = ("--host", SERVER, "--tls-cert", str(cert_pem), "--tls-key", str(key_pem))
    server = ServeProcess(
        base / "plane", heartbeat_timeout=30, args=(*tls, "--ca-cert", str(ca_pem)), env=clean
    )
    with server:
        assert server.url.startswith(f"https://{SERVER}:")
        with httpx.Client(verify=ssl.create_default_context(cafile=str(ca_pem)), timeout=30) as h:
            made = h.post(
                f"{server.url}/api/v1/tokens",
                json={"kind": "join", "ttl": 600},
                headers={"Authorization": f"Bearer {server.admin_token}"},
            )
        assert made.status_code == 201, made.text
        worker = WorkerProcess(
            server.url,
            made.json()["secret"],
            name="wb",
            simulate_gpus=2,
            home=base / "wb",
            args=("--advertise-addr", WORKER, "--ca-cert", str(ca_pem)),
            env=clean,
        )
        gl = spawning.GL
        spawning.GL = ["ip", "netns", "exec", namespace, *gl]  # the worker runs in B
        try:
            worker.start()
        finally:
            spawning.GL = gl
        try:
            env = isolated_env(
                base / "lab",
                GPULAYER_URL=server.url,
                GPULAYER_TOKEN=server.admin_token,
                GPULAYER_CA_CERT=str(ca_pem),
                GPULAYER_SESSION_PRELOAD="",
            )
            done = subprocess.run(
                [GPULAYER, "kernelspec", "install", "--gpus", "1", "--user", "--wait", "120"],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, done.stderr
            lab_settings(base / "lab" / "settings")
            lab = Lab(
                base / "lab",
                app="lab",
                env=env,
                args=[ENABLE, "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None"],
                name="served-lab",
            )
            lab.start(timeout=90)
            try:
                yield ServedLab(server, worker, lab, ca_pem)
            finally:
                lab.stop(timeout=45)
        finally:
            worker.stop()


def run(page: Any, index: int, source: str) -> Any:
    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)
    cell.locator(".cm-content").click()
    page.keyboard.insert_text(source)
    page.keyboard.press("Shift+Enter")
    return cell.locator(".jp-OutputArea")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    from .conftest import CHROMIUM_ARGS

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def test_a_gpu_kernel_on_a_served_plane_waits_with_a_notice_and_outlives_a_kill_of_the_server(
    browser: Any, served_lab: ServedLab
) -> None:
    s = served_lab
    # Both of the worker's GPUs held: the kernel will wait, and say why.
    blocker = s.call(
        "POST",
        "/jobs",
        json={
            "name": "blocker",
            "workload": {"kind": "command", "argv": ["sleep", "600"]},
            "resources": {"gpus": 2},
        },
    )
    page = open_lab(browser, s.lab, "served-gpu-kernel", width=1400, height=900)
    try:
        # The panel shows the served plane (its worker in B), with no "unreachable" banner.
        if "lm-mod-current" not in (page.get_attribute(PANEL_TAB, "class") or ""):
            page.click(PANEL_TAB)
        expect(page.locator("#gpulayer-panel")).to_contain_text("wb", timeout=30 * SECOND)
        expect(page.get_by_test_id("banner")).to_have_count(0)

        card = page.locator('.jp-LauncherCard[data-category="Notebook"]', has_text="1 GPU")
        expect(card).to_have_count(1, timeout=30 * SECOND)
        card.click()
        notice = page.get_by_text(re.compile(r"^Untitled\d*\.ipynb waits for GPUs: "))
        expect(notice).to_be_visible(timeout=30 * SECOND)
        expect(notice).to_contain_text("waiting helps")
        page.wait_for_timeout(800)
        shot(page, "served-gpu-kernel-waits")
        s.call("POST", f"/jobs/{blocker['id']}/cancel")
        page.wait_for_function(
            "() => document.body.innerText.includes('| Idle')", timeout=90 * SECOND
        )
        expect(notice).to_have_count(0, timeout=30 * SECOND)
        where = run(page, 0, "import os\nx = 41\nprint('on', os.environ['GPULAYER_SESSION'])")
        expect(where).to_contain_text("on ", timeout=60 * SECOND)

        # kill -9 of gpulayer serve under a running cell, then start it again.
        ticking = run(
            page,
            1,
            "import time\nfor i in range(30):\n    print('tick', i, flush=True)\n"
            "    time.sleep(0.5)\n",
        )
        expect(ticking).to_contain_text("tick 1", timeout=60 * SECOND)
        s.server.kill()
        expect(ticking).to_contain_text(
            "the control plane is unreachable since", timeout=30 * SECOND
        )
        expect(page.get_by_test_id("banner")).to_be_visible(timeout=60 * SECOND)
        shot(page, "served-gpu-kernel-outage")
        time.sleep(2)
        s.server.start()  # the same address, port and home
        expect(ticking).to_contain_text("tick 29", timeout=90 * SECOND)
        text = ticking.inner_text()
        ticks = [line for line in text.splitlines() if line.startswith("tick ")]
        assert ticks == [f"tick {i}" for i in range(30)], text
        expect(run(page, 2, "x + 1")).to_contain_text("42", timeout=60 * SECOND)  # state kept
        expect(page.get_by_test_id("banner")).to_have_count(0, timeout=60 * SECOND)
        shot(page, "served-gpu-kernel-after-outage")
    except BaseException:
        shot(page, "served-gpu-kernel-FAILED")
        raise
    finally:
        with contextlib.suppress(Exception):
            s.call("POST", f"/jobs/{blocker['id']}/cancel")
        page.context.close()
