"""A real Prometheus (Debian's ``prometheus``) scrapes a served control plane with a viewer token
and answers PromQL about it; the same target without a token is down with a 401. Skipped where
the binary is missing (``install.sh --dev`` installs it as root)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpulayer_kernel.contracts import CommandWorkload, JobSpec
from gpulayer_kernel.testing.processes import ServeProcess, stop_popen

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not Path(PROMETHEUS).exists(), reason="no prometheus binary (apt-get install prometheus)"
    ),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def config(target: str, token: str) -> str:
    return f"""
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: gpulayer
    metrics_path: /api/v1/metrics
    authorization:
      type: Bearer
      credentials: {token}
    static_configs:
      - targets: ["{target}"]
  - job_name: no-token
    metrics_path: /api/v1/metrics
    static_configs:
      - targets: ["{target}"]
"""


def query(http: httpx.Client, promql: str) -> list[Any]:
    r = http.get("/api/v1/query", params={"query": promql})
    r.raise_for_status()
    result: list[Any] = r.json()["data"]["result"]
    return result


def eventually(http: httpx.Client, promql: str, timeout: float = 30.0) -> list[Any]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = query(http, promql)
        except httpx.HTTPError:
            result = []  # Prometheus still starting
        if result or time.monotonic() > deadline:
            return result
        time.sleep(0.3)


def test_prometheus_scrapes_with_a_viewer_token_and_answers_promql(tmp_path: Path) -> None:
    with ServeProcess(tmp_path / "home") as server:
        admin = {"Authorization": f"Bearer {server.admin_token}"}
        with httpx.Client(base_url=server.url + "/api/v1", headers=admin, trust_env=False) as c:
            c.post("/users", json={"name": "prometheus", "role": "viewer"}).raise_for_status()
            made = c.post("/tokens", json={"kind": "client", "user": "prometheus"})
            viewer = made.raise_for_status().json()["secret"]
        with server.client() as client:
            job = client.submit(JobSpec(name="watched", workload=CommandWorkload(argv=["true"])))
            client.cancel(job.id)
        port = free_port()
        cfg = tmp_path / "prometheus.yml"
        cfg.write_text(config(server.url.removeprefix("http://"), viewer))
        log = (tmp_path / "prometheus.log").open("wb")
        proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={cfg}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", trust_env=False) as http:
                done = eventually(http, 'gpulayer_jobs_finished_total{state="cancelled"} >= 1')
                assert done, (tmp_path / "prometheus.log").read_text()[-2000:]
                assert float(done[0]["value"][1]) == 1.0
                assert eventually(http, 'up{job="gpulayer"} == 1')
                assert eventually(http, 'up{job="no-token"} == 0')  # scraped, and refused
                targets = http.get("/api/v1/targets").json()["data"]["activeTargets"]
                refused = [t for t in targets if t["labels"]["job"] == "no-token"]
                assert "401" in refused[0]["lastError"]
                # A scrape's own latency is recorded after its answer: a later scrape carries
                # it, so wait for one rather than read once.
                latency = eventually(
                    http, 'gpulayer_http_request_duration_seconds_count{route="/metrics"} >= 1'
                )
                assert latency and float(latency[0]["value"][1]) >= 1
        finally:
            stop_popen(proc)
            log.close()
        assert proc.poll() is not None  # Prometheus is not left running
