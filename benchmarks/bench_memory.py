"""The control plane's memory under hostile output (issue 32, item 1; issue 33, item 3).

A real ``gpulayer serve`` and a real ``gpulayer worker``; the server's resident memory (RSS, from
``/proc``) is read before, at its peak and after each case, against a stated ceiling:

* ``session``: one session whose cells each print ``--emoji-mib`` MiB of emoji (4 bytes a
  character: the costliest text Python holds), ``--cells`` times, then the session stops;
* ``lines``: ``--jobs`` jobs at once, each writing one ``--line-mib`` MiB line (sent in pieces);
* ``kernel``: a user-role token starts a GPU kernel that can never be placed, then posts
  ``--posts`` batches of ``--frame-mib`` MiB of frames to it (each refused once its lane is full);
* ``soak``: ``soak.py --mix``'s chatty jobs and session cells for ``--soak-seconds`` (optional).

Each line says the case, RSS before, peak and after, in MiB; the last line is the peak over all
cases as a ratio of the ceiling (≤ 1.0 holds it)::

    python benchmarks/bench_memory.py --cases session,lines,kernel --ceiling-mib 300
"""

from __future__ import annotations

import argparse
import base64
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from _machine import describe

from gpulayer_kernel import bundles
from gpulayer_kernel.contracts import (
    CellRequest,
    JobSpec,
    PythonWorkload,
    Resources,
    SessionHolder,
    SessionSpec,
)
from gpulayer_kernel.testing import ServeProcess, WorkerProcess, wait_until

HOLDER = SessionHolder(client="bench-memory")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Sampler:
    """The server's RSS sampled every 50 ms on a thread while a case runs; ``peak`` its most."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = rss_mib(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, rss_mib(self.pid))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_mib(self.pid))


@contextmanager
def served(root: Path) -> Iterator[tuple[ServeProcess, int]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    env["GPULAYER_SESSION_PRELOAD"] = ""
    with ServeProcess(root / "home", heartbeat_timeout=30, env=env) as server:
        join = server.create_token("join", ttl=3600)
        with WorkerProcess(server.url, join, name="w1", home=root / "w1", env=env):
            assert server.proc is not None
            yield server, server.proc.pid


def case_session(server: ServeProcess, cells: int, mib: float) -> None:
    chars = int(mib * (1 << 20) / 4)
    code = f"print('\\U0001F600' * {chars})\n'ok'"
    with server.client(timeout=300) as c:
        info = c.start_session(SessionSpec(name="mem", holder=HOLDER))
        wait_until(lambda: c.get_session("mem").status.value == "idle", 120)
        for _ in range(cells):
            page = c.run_cell("mem", CellRequest(code=code, client=HOLDER.client), wait=60)
            while not page.finished:
                page = c.follow_cell("mem", page.cell.number, page.next_since, wait=60)
        c.stop_session(info.id)


def case_lines(server: ServeProcess, jobs: int, mib: float) -> None:
    code = f"import sys\nsys.stdout.write('y' * {int(mib * (1 << 20))} + '\\n')\n".encode()
    digest, data = bundles.build({"line.py": code})
    with server.client(timeout=300) as c:
        c.put_bundle(data, digest)
        spec = JobSpec(
            workload=PythonWorkload(bundle=digest, entrypoint="line.py"),
            resources=Resources(),
        )
        ids = [c.submit(spec).id for _ in range(jobs)]
        for job_id in ids:
            c.wait(job_id, timeout=600)


def case_kernel(server: ServeProcess, posts: int, mib: float) -> tuple[int, int]:
    """(accepted, refused) frame posts to a kernel that waits for 64 GPUs."""
    admin = {"Authorization": f"Bearer {server.admin_token}"}
    with httpx.Client(base_url=server.url + "/api/v1/", headers=admin) as h:
        h.post("users", json={"name": "mallory", "role": "user"}).raise_for_status()
        r = h.post("tokens", json={"kind": "client", "user": "mallory", "ttl": 3600})
        token = r.raise_for_status().json()["secret"]
    headers = {"Authorization": f"Bearer {token}"}
    part = base64.b64encode(os.urandom(int(mib * (1 << 20) * 3 / 4))).decode()
    frames = {"frames": [{"channel": "shell", "parts": [part]}]}
    accepted = refused = 0
    with httpx.Client(base_url=server.url + "/api/v1/", headers=headers, timeout=120) as h:
        start = {
            "gpus": 64,
            "key": "k" * 32,
            "holder": {"client": "mallory-host"},
            "wait_for_capacity": True,
        }
        r = h.post("kernels", json=start)
        r.raise_for_status()
        kernel = r.json()["id"]
        for _ in range(posts):
            r = h.post(f"kernels/{kernel}/frames", json=frames)
            if r.status_code < 300:
                accepted += 1
            else:
                refused += 1
        h.post(f"sessions/{kernel}/stop", params={"reason": "bench over"})
    return accepted, refused


def run_case(name: str, pid: int, fn: Callable[[], object]) -> tuple[float, float, float, object]:
    before = rss_mib(pid)
    started = time.monotonic()
    with Sampler(pid) as s:
        out = fn()
        time.sleep(2.0)  # what a case frees is freed by now (its owner ended)
    after = rss_mib(pid)
    took = time.monotonic() - started
    print(
        f"{name:8} before {before:7.1f} MiB  peak {s.peak:7.1f} MiB  after {after:7.1f} MiB  "
        f"({took:.1f}s){'' if out is None else f'  {out}'}",
        flush=True,
    )
    return before, s.peak, after, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="session,lines,kernel")
    ap.add_argument("--cells", type=int, default=160)
    ap.add_argument("--emoji-mib", type=float, default=9.0)
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--line-mib", type=float, default=70.0)
    ap.add_argument("--posts", type=int, default=150)
    ap.add_argument("--frame-mib", type=float, default=7.3)
    ap.add_argument("--ceiling-mib", type=float, default=300.0)
    args = ap.parse_args()
    print(f"machine: {describe()}; load {os.getloadavg()[0]:.2f}")
    peak = 0.0
    with (
        tempfile.TemporaryDirectory(prefix="gl-bench-memory-") as tmp,
        served(Path(tmp)) as (
            server,
            pid,
        ),
    ):
        print(f"server pid {pid}: {rss_mib(pid):.1f} MiB at rest")
        cases: dict[str, Callable[[], object]] = {
            "session": lambda: case_session(server, args.cells, args.emoji_mib),
            "lines": lambda: case_lines(server, args.jobs, args.line_mib),
            "kernel": lambda: case_kernel(server, args.posts, args.frame_mib),
        }
        for name in args.cases.split(","):
            if name not in cases:
                print(f"unknown case {name!r} (one of {', '.join(cases)})", file=sys.stderr)
                return 2
            _, case_peak, _, _ = run_case(name, pid, cases[name])
            peak = max(peak, case_peak)
    print(f"peak {peak:.1f} MiB against a ceiling of {args.ceiling_mib:.0f} MiB")
    print(f"{peak / args.ceiling_mib:.2f}x the ceiling")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
